"""The user's own recipe, unchanged: pytorch/examples' mnist (``Net``, Adadelta lr=1.0, StepLR
gamma=0.7 once per epoch) and word_language_model (``RNNModel`` LSTM 200x200x2, dropout 0.2,
batch 20, bptt 35, lr 20 with plain SGD, clip 0.25, batches in ``batchify`` order with the
hidden state carried across them; here with its gradients averaged in bfloat16, which gloo
reduces) under real torchrun with 2 gloo ranks, on local data:
scikit-learn's digits upsampled and padded to 28x28 for ``Net``, the Zen of Python for the word
model (no downloads). The model code below is copied from pytorch/examples (commit 77f55b9)
without a change; only the glue around it (``build_model``, ``compute_loss``, the dataset.py)
is ACE3's.

The mnist recipe runs twice, with the same result: from the config (``optimizer="Adadelta"``,
the ``step`` schedule) under DDP, and from the model file's ``configure_optimizers`` under
ZeRO-1 (which wraps the user's optimizer and moves its scheduler onto the wrapper).
"""

from __future__ import annotations

import codecs
import json
import math
import this
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration.runtime.test_runtime_torchrun import assert_ok, events, run_job

pytestmark = pytest.mark.slow

# pytorch/examples mnist/main.py, class Net (unchanged), and the recipe's loss.
MNIST_MODEL = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def build_model():
    return Net()


def compute_loss(model, batch):
    data, target = batch
    return F.nll_loss(model(data), target)
"""

# The recipe's optimizer and schedule, built by the model file itself (StepLR's step_size is
# one epoch of optimizer steps: the recipe steps it once per epoch).
CONFIGURE_OPTIMIZERS = """

def configure_optimizers(model):
    from torch.optim.lr_scheduler import StepLR

    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    return optimizer, StepLR(optimizer, step_size=STEPS_PER_EPOCH, gamma=0.7)
"""

# pytorch/examples word_language_model/model.py, class RNNModel (unchanged), main.py's
# repackage_hidden (unchanged), and the glue of main.py's train(): the hidden state goes from
# one batch to the next (detached), from zeros at each epoch's first batch.
WORD_MODEL = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super(RNNModel, self).__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        if rnn_type in ['LSTM', 'GRU']:
            self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        else:
            try:
                nonlinearity = {'RNN_TANH': 'tanh', 'RNN_RELU': 'relu'}[rnn_type]
            except KeyError as e:
                raise ValueError( """An invalid option for `--model` was supplied,
                                 options are ['LSTM', 'GRU', 'RNN_TANH' or 'RNN_RELU']""") from e
            self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity=nonlinearity, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)

        # Optionally tie weights as in:
        # "Using the Output Embedding to Improve Language Models" (Press & Wolf 2016)
        # https://arxiv.org/abs/1608.05859
        # and
        # "Tying Word Vectors and Word Classifiers: A Loss Framework for Language Modeling" (Inan et al. 2016)
        # https://arxiv.org/abs/1611.01462
        if tie_weights:
            if nhid != ninp:
                raise ValueError('When using the tied flag, nhid must be equal to emsize')
            self.decoder.weight = self.encoder.weight

        self.init_weights()

        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == 'LSTM':
            return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                    weight.new_zeros(self.nlayers, bsz, self.nhid))
        else:
            return weight.new_zeros(self.nlayers, bsz, self.nhid)


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""

    if isinstance(h, torch.Tensor):
        return h.detach()
    else:
        return tuple(repackage_hidden(v) for v in h)


class CarriedHidden(nn.Module):
    """RNNModel with main.py's hidden state: carried from batch to batch (truncated BPTT)."""

    def __init__(self, ntoken, trace):
        super().__init__()
        self.lm = RNNModel("LSTM", ntoken, 200, 200, 2, 0.2, False)
        self.hidden = None
        self.trace = trace

    def forward(self, data, first_chunk):
        if first_chunk or self.hidden is None:  # an epoch's first batch, as main.py's train()
            self.hidden = self.lm.init_hidden(data.size(1))
        output, hidden = self.lm(data, repackage_hidden(self.hidden))
        self.hidden = hidden
        return output


def build_model(ntoken, trace):
    return CarriedHidden(ntoken, trace)


def compute_loss(model, batch):
    x, y, chunk, column = batch  # (batch, bptt) each: main.py's get_batch, batch-first
    own = model.module if hasattr(model, "module") else model
    with open(own.trace, "a") as trace:
        trace.write(f"{chunk.tolist()} {column.tolist()}\\n")
    output = model(x.t().contiguous(), bool(chunk[0] == 0))
    return F.nll_loss(output, y.t().reshape(-1))
'''

# main.py's batchify and get_batch over a local corpus (data.py's tokenisation: words + <eos>
# per line); item chunk * 20 + column is rows [35 chunk, 35 chunk + 35) of that column.
WORD_DATASET = """
from pathlib import Path

import torch
from torch.utils.data import Dataset

BATCH, BPTT = 20, 35


def tokens():
    vocabulary = {}
    ids = []
    for line in (Path(__file__).parent / "corpus.txt").read_text().splitlines():
        for word in line.split() + ["<eos>"]:
            ids.append(vocabulary.setdefault(word, len(vocabulary)))
    return torch.tensor(ids, dtype=torch.int64)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    data = data.view(bsz, -1).t().contiguous()
    return data


class Chunks(Dataset):
    def __init__(self):
        self.source = batchify(tokens(), BATCH)
        self.chunks = (self.source.size(0) - 1) // BPTT

    def __len__(self):
        return self.chunks * BATCH

    def __getitem__(self, index):
        chunk, column = divmod(index, BATCH)
        i = chunk * BPTT
        return (self.source[i:i + BPTT, column], self.source[i + 1:i + 1 + BPTT, column],
                chunk, column)


def build_dataset(split):
    return Chunks() if split == "train" else None
"""


def _job(name: str, root: Path, config: dict[str, Any], model: str, dataset: Path,
         kwargs: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "job_id": name, "attempt": 1, "config": {"num_gpus": 2, "log_interval": 1, **config},
        "model": {"path": str(root / model), "kind": "file", "factory": "build_model",
                  "kwargs": kwargs or {}},
        "dataset": {"path": str(dataset)}, "validation_dataset": None, "resume_from": None,
    }  # fmt: skip


def _history(job_dir: Path, key: str) -> list[tuple[int, float]]:
    return [
        (e["step"], e["values"][key])
        for e in events(job_dir)
        if e["type"] == "metrics" and key in e["values"] and "val_loss" not in e["values"]
    ]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("recipes")
    digits = load_digits()
    images = (digits.data[:128] / 16.0).reshape(-1, 1, 8, 8).repeat(3, 2).repeat(3, 3)
    padded = np.pad(images, ((0, 0), (0, 0), (2, 2), (2, 2)))  # 28x28, as MNIST
    normalized = (padded - 0.1307) / 0.3081  # the recipe's transforms.Normalize
    np.savez(root / "digits28.npz", X=normalized.astype(np.float32), y=digits.target[:128])
    (root / "mnist.py").write_text(MNIST_MODEL)
    (root / "mnist_own_optimizer.py").write_text(
        MNIST_MODEL + CONFIGURE_OPTIMIZERS.replace("STEPS_PER_EPOCH", "2")
    )
    (root / "word.py").write_text(WORD_MODEL)
    corpus = root / "corpus"
    corpus.mkdir()
    zen = codecs.decode(this.s, "rot13")
    (corpus / "corpus.txt").write_text("\n".join([zen] * 22))
    (corpus / "dataset.py").write_text(WORD_DATASET)
    return root


# 128 digits, global batch 64 (the recipe's): 2 optimizer steps per epoch, 2 epochs.
MNIST = {"batch_size": 64, "epochs": 2, "validation_split": 0.0, "seed": 1}


def test_mnist_recipe_from_the_config_and_from_configure_optimizers(root: Path) -> None:
    by_config = run_job(_job("mnist", root, {**MNIST, "optimizer": "Adadelta", "learning_rate": 1.0,
                        "lr_scheduler": {"name": "step", "params": {"step_size": 2, "gamma": 0.7}}},
                        "mnist.py", root / "digits28.npz"), root / "mnist")  # fmt: skip
    assert_ok(by_config)
    own = run_job(_job("mnist-own", root, {**MNIST, "zero_stage": 1}, "mnist_own_optimizer.py",
                       root / "digits28.npz"), root / "mnist-own")  # fmt: skip
    assert_ok(own)
    assert "ZeRO stage 1" in own.stdout
    lrs = [lr for _, lr in _history(root / "mnist", "learning_rate")]
    assert lrs == pytest.approx([1.0] * 2 + [0.7] * 2)  # StepLR(gamma=0.7) once per epoch
    assert [lr for _, lr in _history(root / "mnist-own", "learning_rate")] == pytest.approx(lrs)
    losses = [loss for _, loss in _history(root / "mnist", "train_loss")]
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0]  # it learns
    # ZeRO-1 around the model file's Adadelta: the same run as DDP with the config's.
    own_losses = [loss for _, loss in _history(root / "mnist-own", "train_loss")]
    assert own_losses == pytest.approx(losses, rel=1e-4)


def test_word_language_model_recipe_in_batchify_order(root: Path) -> None:
    ntoken = len({w for line in (root / "corpus" / "corpus.txt").read_text().splitlines()
                  for w in line.split()}) + 1  # fmt: skip
    traces = root / "word-trace"
    traces.mkdir()
    config = {"batch_size": 20, "epochs": 2, "optimizer": "SGD", "learning_rate": 20.0,
              "max_grad_norm": 0.25, "shuffle": False, "validation_split": 0.0, "seed": 1111,
              "communication_data_type": "bf16"}  # fmt: skip
    job = _job("word", root, config, "word.py", root / "corpus",
               {"ntoken": ntoken, "trace": str(traces / "batches.txt")})  # fmt: skip
    # Each rank appends to its own trace: the file name gets the rank (the kwargs are shared).
    (root / "word.py").write_text(
        WORD_MODEL.replace('open(own.trace, "a")', 'open(f"{own.trace}.{os.environ[\'RANK\']}", "a")')
        .replace("import torch\n", "import os\nimport torch\n", 1)
    )  # fmt: skip
    done = run_job(job, root / "word")
    assert_ok(done)
    summary = events(root / "word")[-1]
    chunks = summary["steps"] // 2  # 2 epochs of batches, one optimizer step each
    assert chunks >= 3
    for rank in (0, 1):
        seen = [
            line.split("] [") for line in (traces / f"batches.txt.{rank}").read_text().splitlines()
        ]
        # shuffle=False: replica r reads items r, r + 2, ...: chunk k's columns r, r + 2, ...,
        # in chunk order, every epoch (so the hidden state of a column follows that column).
        assert [json.loads(c + "]") for c, _ in seen] == [[k] * 10 for k in range(chunks)] * 2
        assert all(json.loads("[" + cols) == list(range(rank, 20, 2)) for _, cols in seen)
    losses = [loss for _, loss in _history(root / "word", "train_loss")]
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[0] == pytest.approx(math.log(ntoken), rel=0.2)  # uniform at first
    assert losses[-1] < losses[0] - 0.25  # lr 20, clip 0.25: it learns the repeated text
