"""Checks that refuse an upload at the door when the engine would certainly fail on it later.

Each checker reads only what it needs (a Python module's syntax tree, a zip's directory and the
first bytes of its members, the first rows of a text file, a pickle's opcodes), never imports or
unpickles anything, and never needs torch or numpy: the server has neither. A problem is an
:class:`UploadCheckError` whose message says what is wrong; the caller turns it into a 422
naming the file.
"""

from ace3_server.upload_checks.errors import UploadCheckError

__all__ = ["UploadCheckError"]
