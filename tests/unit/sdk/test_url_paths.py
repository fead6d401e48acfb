"""A dataset or model path that looks like a URL (s3://, gs://, http(s)://, hf://) is refused
where paths are read, unmangled, saying what is supported instead: the SDK's load_dataset and
load_model, the CLI's job files and an in-process run's data path (the API's ids:
tests/integration/server/test_api.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import nn

import ace3
from ace3.cli.errors import BAD_INPUT, CLIError
from ace3.cli.jobfile import load_job_file
from ace3.errors import UnsupportedFeatureError
from ace3.locations import refuse_url, url_scheme
from tests.unit.sdk.sdk_fakes import MockAPI


@pytest.mark.parametrize(
    ("path", "scheme"),
    [("s3://my-bucket/train", "s3"), ("gs://b/x.npz", "gs"), ("https://x.org/d.csv", "https"),
     ("hf://datasets/user/name", "hf"), ("HTTP://X", "http"), ("data/train.npz", None),
     ("C:\\data\\train.npz", None), ("./s3:/x", None)],
)  # fmt: skip
def test_url_scheme(path: str, scheme: str | None) -> None:
    assert url_scheme(path) == scheme


def test_the_sdk_refuses_urls_unmangled_before_any_request(api: MockAPI) -> None:
    client = api.client()
    with pytest.raises(UnsupportedFeatureError) as caught:
        client.load_dataset("s3://my-bucket/train")
    message = str(caught.value)
    assert "dataset 's3://my-bucket/train' is a URL (s3://)" in message
    assert "a local file (.pt, .npz, .csv, .jsonl)" in message and "aws s3 cp" in message
    assert caught.value.problems[0].field == "dataset"
    with pytest.raises(UnsupportedFeatureError, match=r"model 'hf://u/m' is a URL.*\.py file"):
        client.load_model("hf://u/m")
    assert api.requests == []


def test_a_job_file_with_a_url_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("def build_model(): ...\n")
    (tmp_path / "job.yaml").write_text("model: model.py\ndataset: gs://bucket/train.npz\n")
    with pytest.raises(CLIError) as caught:
        load_job_file(tmp_path / "job.yaml", [])
    assert caught.value.code == BAD_INPUT
    assert "dataset 'gs://bucket/train.npz' is a URL (gs://)" in str(caught.value)


def test_an_in_process_run_refuses_a_url_for_its_data() -> None:
    trainer = ace3.Trainer(ace3.TrainingConfig(epochs=1, batch_size=4))
    with pytest.raises(UnsupportedFeatureError, match=r"dataset 'https://x\.org/d\.csv' is a URL"):
        trainer.train(nn.Linear(2, 2), "https://x.org/d.csv")


def test_a_file_url_points_at_the_path_itself() -> None:
    with pytest.raises(UnsupportedFeatureError, match=r"give the path itself: '/tmp/d\.npz'"):
        refuse_url("file:///tmp/d.npz", "dataset")
