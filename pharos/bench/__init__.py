"""The open-loop benchmark harness: ``pharos bench run`` sends a seeded
workload at its scheduled times, ``compare`` runs every policy on fresh simulated fleets, and
``report`` turns result files alone into tables and charts.

One job per module: ``records`` (what one request measured), ``stream`` (reading one streamed
reply), ``summary`` (the statistics of a run), ``openloop`` (sending on schedule),
``result`` (the result file), ``progress`` (the terminal line), ``processes`` (child processes
and their readiness), ``fleet`` (the engines and Pharos instances of one run), ``restarts``
(several instances, restarting one mid-run, the load balancer's health checks), ``workloads``
(the seeded request schedules), ``swaps`` (swap counting on a one-model host, on a Clock),
``run``, ``compare`` and ``report`` (the three subcommands), ``pick`` and ``overhead`` (the
decision's time and what Pharos adds to one request).
"""
