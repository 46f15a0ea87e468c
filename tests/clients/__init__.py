"""Real clients' captures (``sink.py``) and the Node drivers (``node/``); the tests that drive
and replay them are tests/component/test_clients*.py."""
