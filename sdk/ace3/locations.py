"""Where data and model code come from: local paths (and, for datasets, ids; shards in a bucket
are registered by reference: ``client.datasets.register``). A string that looks like a URL
(``s3://``, ``gs://``, ``http(s)://``, ``hf://``, ...) is refused before it becomes a path
(``Path("s3://b/x")`` is ``s3:/b/x``), with what is supported instead. Torch-free; the SDK's
``load_dataset``/``load_model``, the CLI's job files, an in-process run's data path and the
API's dataset ids all ask :func:`refuse_url`.
"""

from __future__ import annotations

import os
import re

from ace3.config.problem import ConfigProblem
from ace3.errors import UnsupportedFeatureError

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

#: How to fetch each kind of URL to a local copy (the hint in the error).
_FETCH = {
    "s3": "aws s3 cp --recursive {url} ./data",
    "gs": "gcloud storage cp -r {url} ./data",
    "gcs": "gcloud storage cp -r {url} ./data",
    "http": "curl -LO {url}",
    "https": "curl -LO {url}",
    "hf": "huggingface-cli download <repo> --repo-type dataset --local-dir ./data",
}

SUPPORTED = (
    "a local file (.pt, .npz, .csv, .jsonl), a directory (with a dataset.py, or of such "
    "files), or a .tar.gz/.tar/.zip of a directory; the SDK uploads it to the service"
)

MODEL_SUPPORTED = (
    "a local .py file or a directory of Python code (a package); the SDK packs and uploads it"
)


def url_scheme(path: str | os.PathLike[str]) -> str | None:
    """The scheme of ``path`` if it looks like a URL (``scheme://...``), else None."""
    match = _URL.match(os.fspath(path))
    return match.group(1).lower() if match else None


def refuse_url(path: str | os.PathLike[str], what: str, supported: str = SUPPORTED) -> None:
    """Raise :class:`~ace3.errors.UnsupportedFeatureError` naming ``what`` if ``path`` is a
    URL: ACE3 reads local paths only (``supported``); say how to fetch a copy."""
    scheme = url_scheme(path)
    if scheme is None:
        return
    url = os.fspath(path)
    if scheme == "file":
        hint = f"give the path itself: {url[len('file://') :]!r}"
    else:
        fetch = _FETCH.get(scheme, "download it").format(url=url)
        hint = f"copy it to this machine first (e.g. `{fetch}`) and give that local path"
    if scheme == "s3" and what == "dataset":
        reason = (
            f"{what} {url!r} is a URL ({scheme}://): a path here is read on this machine. To "
            f"train on shards in a bucket without copying them, register the prefix (the "
            f"service must be allowed to read it): client.datasets.register({url!r}, "
            f"format=...) or `ace3 datasets register {url} --format ...`, and pass the "
            f"dataset it returns. Otherwise this takes {supported}: {hint}"
        )
    else:
        registered = (
            " (shards under an s3:// prefix can be registered instead: client.datasets.register)"
            if what == "dataset"
            else ""
        )
        reason = (
            f"{what} {url!r} is a URL ({scheme}://): ACE3 does not read from URLs{registered}; "
            f"it takes {supported}: {hint}"
        )
    raise UnsupportedFeatureError(reason, [ConfigProblem(field=what, reason=reason)])
