"""Per-job Python environments (docs/environments.md): the packages a job asks for
(``jobs.requirements``), resolved against the worker's own installation so they only add to
it, built once per cluster, kept in each machine's cache and linked read-only into the job's
directory as ``env/`` (the runtime appends it to ``sys.path`` after the worker's packages).

- :mod:`.identity`: an environment's hash (requirements, Python, platform, installed set).
- :mod:`.uv_commands`: what uv is asked (resolve, install) and how its answers are read.
- :mod:`.build`: running uv in the worker's sandbox as an unprivileged uid, with its limits.
- :mod:`.archive`: the store's ``tar.gz`` of a tree.
- :mod:`.registry`: the environments row, also the cluster-wide build lock.
- :mod:`.cache`: this machine's cache (bounded, least recently used evicted, pins).
- :mod:`.prepare`: the whole preparation of one attempt's environment.
- :mod:`.service_log`: the job's log lines meanwhile.
"""
