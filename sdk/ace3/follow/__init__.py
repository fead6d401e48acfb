"""Following a job or a search from the SDK: the handles (:class:`~.job_handle.JobHandle`,
:class:`~.search_handle.SearchHandle`) with their wait / Ctrl-C / timeout loop (:mod:`.waiting`)
and the live displays (a terminal view with rich, plain lines otherwise)."""
