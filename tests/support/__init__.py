"""Helpers the tests share: rigs, fakes, fixtures' readers. No test lives here,
and no test module imports another."""
