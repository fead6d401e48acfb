"""Following a job or a search from the SDK: the handles (:class:`~.job_handle.JobHandle`,
:class:`~.search_handle.SearchHandle`) with their wait / Ctrl-C / timeout loop (:mod:`.waiting`)
and the live displays (a terminal view with rich, plain lines otherwise).

The client hands these handles out (``client.job(id)``, ``client.search(id)``) through
:func:`ace3.client.handles.register_handles`, called here: the follow package depends on the
client, never the other way round."""

from ace3.client.handles import register_handles
from ace3.follow.job_handle import JobHandle
from ace3.follow.search_handle import SearchHandle

register_handles(job=JobHandle, search=SearchHandle)
