"""TrainingProfiler (local and via a job's ProfilerHook), MemoryProfiler and the memory meter."""

from __future__ import annotations

import json
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import ace3.training.profiling as profiling
from ace3.config import TrainingConfig
from ace3.config.specs import ProfilerSpec
from ace3.runtime.loop.hooks import HookList, RunContext
from ace3.runtime.observe.memory_meter import (
    MIB,
    PeakMemoryMeter,
    RssSampler,
    efficiency_percent,
    memory_summary,
)
from ace3.runtime.observe.profile_events import (
    KEY_AVERAGES_FILE,
    TRACE_FILE,
    read_key_averages,
    rebuild_event_list,
    write_key_averages,
)
from ace3.runtime.observe.profiler_hook import ProfilerHook
from ace3.runtime.observe.state_size import training_state_bytes
from ace3.training.profiling import (
    MemoryProfiler,
    ProfilerActivity,
    ProfilingError,
    TrainingProfiler,
    active_profilers,
    combined_remote_spec,
)


def _model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _run(tmp_path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, rank: int = 0):
    return RunContext(
        model=model,
        optimizer=optimizer,
        config=TrainingConfig(),
        rank=rank,
        world_size=2 if rank else 1,
        device=torch.device("cpu"),
        output_dir=tmp_path,
    )


def _drive(hooks: HookList, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int):
    hooks.on_train_begin()
    hooks.on_epoch_begin(1)
    for batch in range(steps):
        hooks.on_batch_begin(batch)
        _train_step(model, optimizer)
        hooks.on_batch_end(batch, {})
    hooks.on_epoch_end(1, {})
    hooks.on_train_end({})
    hooks.close()


# -- TrainingProfiler, in process -----------------------------------------------------------


def test_local_profile_table_and_chrome_trace(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    profiler = TrainingProfiler(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        record_shapes=True,
        profile_memory=True,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profiler:
            assert profiler in active_profilers()
            for _ in range(3):
                _train_step(model, optimizer)
    assert profiler not in active_profilers()
    cuda_warnings = [w for w in caught if "CUDA" in str(w.message)]
    assert len(cuda_warnings) == (0 if torch.cuda.is_available() else 1)

    table = profiler.key_averages().table(sort_by="cuda_time_total")
    assert "aten::addmm" in table and "# of Calls" in table
    assert "CPU Mem" in table  # profile_memory
    assert "Input Shapes" in profiler.key_averages(group_by_input_shape=True).table()

    trace = profiler.export_chrome_trace(tmp_path / "training_trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "aten::addmm" for e in events)


def test_results_before_profiling_are_clear_errors(tmp_path: Path) -> None:
    profiler = TrainingProfiler()
    with pytest.raises(ProfilingError, match="nothing was profiled"):
        profiler.key_averages()
    with pytest.raises(ProfilingError, match="nothing was profiled"):
        profiler.export_chrome_trace(tmp_path / "t.json")
    with pytest.raises(ProfilingError, match="source 'nope'"):
        profiler.key_averages(source="nope")


def test_bad_arguments_name_the_argument() -> None:
    with pytest.raises(ValueError, match="activities"):
        TrainingProfiler(activities=["tpu"])
    with pytest.raises(ValueError, match="activities is empty"):
        TrainingProfiler(activities=[])
    with pytest.raises(TypeError, match="record_shapes"):
        TrainingProfiler(record_shapes="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="schedule_steps"):
        TrainingProfiler(schedule_steps=(1, 1, 0))
    # torch's own activity enum is accepted too
    profiler = TrainingProfiler(activities=[torch.profiler.ProfilerActivity.CPU, "cuda"])
    assert profiler.activities == [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def test_local_schedule_records_only_its_window() -> None:
    model, optimizer = _model_and_optimizer()
    profiler = TrainingProfiler(schedule_steps=(1, 1, 2))
    with profiler:
        for _ in range(6):
            _train_step(model, optimizer)
            profiler.step()
    steps = [e for e in profiler.key_averages() if e.key.startswith("ProfilerStep")]
    assert steps and steps[0].count == 2

    never = TrainingProfiler(schedule_steps=(5, 1, 1))
    with never:
        _train_step(model, optimizer)
    with pytest.raises(ProfilingError, match="never reached"):
        never.key_averages()


def test_registry_nesting_and_reentry(tmp_path: Path) -> None:
    memory = MemoryProfiler()
    memory.start()
    outer = TrainingProfiler(record_shapes=True)
    inner = TrainingProfiler(activities=["cpu"], schedule_steps=(0, 1, 5))
    try:
        with outer:
            with pytest.raises(ProfilingError, match="already active"):
                outer.__enter__()
            with pytest.warns(UserWarning, match="already profiling this process"), inner:
                assert active_profilers() == [memory, outer, inner]
                assert profiling.active_training_profilers() == [outer, inner]
                assert profiling.active_memory_profilers() == [memory]
                spec = combined_remote_spec(profiling.active_training_profilers())
                assert spec is not None and spec.record_shapes and spec.active == 5
    finally:
        memory.stop()
    assert active_profilers() == []
    with pytest.raises(ProfilingError, match="already profiling"):
        inner.key_averages()  # it recorded remote jobs only


def test_registry_is_thread_safe() -> None:
    profilers = [MemoryProfiler(interval_s=0.05) for _ in range(8)]
    barrier = threading.Barrier(len(profilers))

    def work(p: MemoryProfiler) -> None:
        barrier.wait()
        p.start()
        time.sleep(0.01)
        p.stop()

    threads = [threading.Thread(target=work, args=(p,)) for p in profilers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert active_profilers() == []


# -- TrainingProfiler, remote: the engine hook and load_remote ------------------------------


def test_profiler_hook_writes_trace_and_key_averages(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    spec = ProfilerSpec(activities=["cpu", "cuda"], record_shapes=True, wait=1, warmup=1, active=3)
    hooks = HookList([ProfilerHook(spec)])
    hooks.bind(_run(tmp_path, model, optimizer))
    _drive(hooks, model, optimizer, steps=8)

    directory = tmp_path / "artifacts" / "profiler"
    trace = json.loads((directory / TRACE_FILE).read_text())
    assert any(e.get("name") == "aten::addmm" for e in trace["traceEvents"])
    body = read_key_averages(directory / KEY_AVERAGES_FILE)
    assert body["meta"]["recorded_steps"] == [3, 5]
    if not torch.cuda.is_available():
        assert body["meta"]["dropped_activities"] == ["cuda"]
    step = next(e for e in body["events"] if e["key"].startswith("ProfilerStep"))
    assert step["count"] == 3
    assert body["events_by_input_shape"]

    profiler = TrainingProfiler()
    profiler.load_remote(directory, "job-1")
    table = profiler.key_averages().table(sort_by="cuda_time_total", row_limit=5)
    assert "ProfilerStep*" in table and "# of Calls" in table
    assert "Input Shapes" in profiler.key_averages(group_by_input_shape=True).table()
    copied = profiler.export_chrome_trace(tmp_path / "training_trace.json")
    assert json.loads(copied.read_text()) == trace
    assert profiler.job_ids == ["job-1"]


def test_profiler_hook_ends_inside_window_and_before_it(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    recorded = tmp_path / "rec"
    hooks = HookList([ProfilerHook(ProfilerSpec(wait=0, warmup=1, active=50,
                                                output_dir=str(recorded)))])  # fmt: skip
    hooks.bind(_run(tmp_path, model, optimizer))
    _drive(hooks, model, optimizer, steps=4)
    assert read_key_averages(recorded / KEY_AVERAGES_FILE)["meta"]["recorded_steps"] == [2, 4]
    assert (recorded / TRACE_FILE).is_file()

    missed = tmp_path / "missed"
    hooks = HookList([ProfilerHook(ProfilerSpec(wait=10, warmup=1, active=2,
                                                output_dir=str(missed)))])  # fmt: skip
    hooks.bind(_run(tmp_path, model, optimizer))
    _drive(hooks, model, optimizer, steps=3)
    body = read_key_averages(missed / KEY_AVERAGES_FILE)
    assert body["events"] is None and "before the profiler's window" in body["meta"]["note"]
    profiler = TrainingProfiler()
    profiler.load_remote(missed, "job-2")
    with pytest.raises(ProfilingError, match="job job-2: training ended after 3"):
        profiler.key_averages()
    with pytest.raises(ProfilingError, match="job job-2"):
        profiler.export_chrome_trace(tmp_path / "t.json")


def test_profiler_hook_is_a_no_op_off_rank_zero(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    hooks = HookList([ProfilerHook(ProfilerSpec(wait=0, warmup=0, active=2))])
    hooks.bind(_run(tmp_path, model, optimizer, rank=1))
    _drive(hooks, model, optimizer, steps=3)
    assert not (tmp_path / "artifacts").exists()


def test_rebuilt_table_is_torchs_table(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    with torch.profiler.profile(record_shapes=True, profile_memory=True) as prof:
        for _ in range(2):
            _train_step(model, optimizer)
    write_key_averages(prof, tmp_path, {"record_shapes": True})
    body = read_key_averages(tmp_path / KEY_AVERAGES_FILE)
    meta = body["meta"]
    rebuilt = rebuild_event_list(
        body["events"],
        use_device=meta["use_device"],
        profile_memory=meta["profile_memory"],
        with_flops=meta["with_flops"],
    )
    original = prof.key_averages()
    for kwargs in ({"sort_by": "self_cpu_time_total", "row_limit": 8},
                   {"sort_by": "cpu_memory_usage", "top_level_events_only": True}):  # fmt: skip
        assert rebuilt.table(**kwargs) == original.table(**kwargs)


def test_load_remote_rejects_bad_directories(tmp_path: Path) -> None:
    profiler = TrainingProfiler()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        profiler.load_remote(tmp_path / "missing", "job")
    with pytest.raises(FileNotFoundError, match="wrote no profiler results"):
        profiler.load_remote(tmp_path, "job")
    (tmp_path / KEY_AVERAGES_FILE).write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="expected format"):
        profiler.load_remote(tmp_path, "job")
    with pytest.raises(ValueError, match="job_id"):
        profiler.load_remote(tmp_path, "")


def test_remote_spec_round_trips_into_the_job_config() -> None:
    profiler = TrainingProfiler(
        activities=[ProfilerActivity.CPU], profile_memory=True, schedule_steps=(2, 1, 4)
    )
    spec = profiler.remote_spec()
    assert (spec.wait, spec.warmup, spec.active) == (2, 1, 4)
    config = TrainingConfig(profiler=spec)
    assert TrainingConfig.model_validate_json(config.model_dump_json()).profiler == spec
    assert TrainingProfiler().remote_spec().activities == ["cpu", "cuda"]


# -- MemoryProfiler and the memory meter ----------------------------------------------------


def test_memory_profiler_sees_a_200_mb_allocation() -> None:
    model, optimizer = _model_and_optimizer()
    memory = MemoryProfiler()
    memory.start()
    block = torch.ones(200 * MIB // 4)  # written, so resident
    time.sleep(0.05)
    del block
    _train_step(model, optimizer)
    memory.track(model, optimizer)
    stats = memory.stop()
    assert stats.device == "cpu" and stats.source == "local"
    assert stats.peak_memory_mb >= 190
    assert stats.samples >= 2  # start and stop (the high-water mark), more when sampling
    assert stats.state_memory_mb == pytest.approx(training_state_bytes(model, optimizer) / MIB)
    assert stats.efficiency is not None and 0 < stats.efficiency <= 100
    assert "peak" in str(stats)


def test_memory_profiler_errors_and_remote_figures() -> None:
    memory = MemoryProfiler()
    with pytest.raises(ProfilingError, match=r"before start\(\)"):
        memory.stop()
    memory.start()
    with pytest.raises(ProfilingError, match="already started"):
        memory.start()
    with pytest.raises(ValueError, match="state_bytes"):
        memory.note_training_state(-1)
    with pytest.raises(ValueError, match="peak_memory_mb"):
        memory.note_remote_job("j", peak_memory_mb="big", state_memory_mb=1.0)  # type: ignore[arg-type]
    memory.note_remote_job("j1", peak_memory_mb=400.0, state_memory_mb=100.0, device="cuda")
    memory.note_remote_job("j2", peak_memory_mb=100.0, state_memory_mb=None, samples=9)
    stats = memory.stop()
    assert (stats.peak_memory_mb, stats.efficiency, stats.device) == (400.0, 25.0, "cuda")
    assert stats.source == "remote job j1"
    # without a known state, efficiency is unknown rather than invented
    memory.start()
    assert memory.stop().efficiency is None


def test_training_state_bytes_counts_params_grads_and_optimizer_state() -> None:
    model, optimizer = _model_and_optimizer()
    params = sum(p.numel() * 4 for p in model.parameters())
    assert training_state_bytes(model) == params
    _train_step(model, optimizer)
    # grads (= params) + Adam's exp_avg and exp_avg_sq (= 2 x params) + 4 scalar steps
    step_bytes = sum(s["step"].numel() * s["step"].element_size() for s in optimizer.state.values())
    assert training_state_bytes(model, optimizer) == 4 * params + step_bytes
    tied = nn.Linear(4, 4)
    assert training_state_bytes(nn.ModuleList([tied, tied])) == training_state_bytes(tied)
    with pytest.raises(TypeError, match="model"):
        training_state_bytes(object())


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_the_high_water_mark_sees_a_brief_peak_with_no_thread_and_survives_a_second_sampler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ace3.runtime.observe import memory_meter

    first = memory_meter.RssSampler()
    first.start()
    assert first.method == "hwm" and first._thread is None  # nothing runs beside training
    block = torch.ones(96 * MIB // 4)  # written, so resident, and freed at once
    del block
    second = memory_meter.RssSampler()
    second.start()  # resets the mark: the first sampler takes its peak before
    second.stop()
    first.stop()
    assert first.growth_bytes >= 90 * MIB
    assert second.growth_bytes < 90 * MIB

    # Where the reset is not allowed, a thread samples /proc/self/statm as before.
    monkeypatch.setattr(memory_meter, "_CLEAR_REFS", Path("/proc/self/no-such-file"))
    sampled = memory_meter.RssSampler(interval_s=0.002)
    sampled.start()
    assert sampled.method == "statm" and sampled._thread is not None
    time.sleep(0.01)
    sampled.stop()
    assert sampled.samples >= 2


def test_peak_memory_meter_reports_growth_and_absolute() -> None:
    meter = PeakMemoryMeter(torch.device("cpu"), interval_s=0.002)
    with pytest.raises(RuntimeError, match="not started"):
        meter.stop()
    meter.start()
    block = torch.ones(64 * MIB // 4)
    time.sleep(0.03)
    assert meter.peak_bytes() >= 60 * MIB  # while running (the engine reads it before stop)
    del block
    reading = meter.stop()
    assert meter.stop() == reading  # a second stop (a finally block) returns the same
    assert reading.device == "cpu" and reading.method in ("hwm", "statm", "getrusage")
    assert reading.peak_memory_mb >= 60
    assert reading.absolute_peak_mb >= reading.baseline_mb + reading.peak_memory_mb - 1e-6
    summary = memory_summary(reading, state_bytes=16 * MIB)
    assert summary["memory_device"] == "cpu" and summary["state_memory_mb"] == 16
    assert 0 < summary["memory_efficiency"] <= 100
    with pytest.raises(ValueError, match="device"):
        PeakMemoryMeter("tpu")

    # the SDK side reads the same fields back from the job summary
    memory = MemoryProfiler()
    memory.start()
    assert not memory.note_job_summary("j0", {"steps": 3})
    assert memory.note_job_summary("j1", summary)
    stats = memory.stop()
    assert stats.source == "remote job j1" and stats.samples == reading.samples
    assert stats.peak_memory_mb == summary["peak_memory_mb"]
    assert stats.efficiency == summary["memory_efficiency"]


def test_rss_sampler_and_efficiency_definition() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        RssSampler(0)
    assert efficiency_percent(50.0, 200.0) == 25.0
    assert efficiency_percent(500.0, 200.0) == 100.0  # state built before measuring began
    assert efficiency_percent(None, 200.0) is None
    assert efficiency_percent(10.0, 0.0) is None


def test_a_resumed_attempt_keeps_the_first_profile(tmp_path: Path, capsys) -> None:
    model, optimizer = _model_and_optimizer()
    spec = ProfilerSpec(wait=0, warmup=1, active=2)
    for _ in range(2):
        hooks = HookList([ProfilerHook(spec)])
        hooks.bind(_run(tmp_path, model, optimizer))
        _drive(hooks, model, optimizer, steps=3)
    assert "already holds a recorded profile" in capsys.readouterr().out
    body = read_key_averages(tmp_path / "artifacts" / "profiler" / KEY_AVERAGES_FILE)
    assert body["meta"]["recorded_steps"] == [2, 3]


def test_importing_ace3_profiling_leaves_torch_out() -> None:
    import subprocess
    import sys

    code = (
        "import sys, ace3.training.profiling\n"
        "p = ace3.profiling.TrainingProfiler(activities=[ace3.profiling.ProfilerActivity.CUDA])\n"
        "p.remote_spec(); ace3.profiling.MemoryProfiler()\n"
        "assert 'torch' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
def test_cuda_profile_and_memory(tmp_path: Path) -> None:
    model = nn.Linear(256, 256).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    memory = MemoryProfiler()
    memory.start()
    profiler = TrainingProfiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    with profiler:
        for _ in range(3):
            loss = model(torch.randn(64, 256, device="cuda")).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        block = torch.ones(200 * MIB // 4, device="cuda")
        del block
        torch.cuda.synchronize()
    memory.note_training_state(training_state_bytes(model, optimizer))
    stats = memory.stop()
    assert stats.device == "cuda" and stats.peak_memory_mb >= 200
    assert stats.efficiency is not None and 0 < stats.efficiency <= 100
    table = profiler.key_averages().table(sort_by="cuda_time_total", row_limit=10)
    assert "CUDA total" in table

    meter = PeakMemoryMeter(torch.device("cuda", torch.cuda.current_device()))
    meter.start()
    block = torch.ones(64 * MIB // 4, device="cuda")
    reading = meter.stop()
    del block
    assert reading.device == "cuda" and reading.peak_memory_mb >= 64
    assert meter.cpu_reading is not None and meter.cpu_reading.device == "cpu"


def test_profiler_hook_stands_aside_for_an_in_process_profiler(tmp_path: Path, capsys) -> None:
    model, optimizer = _model_and_optimizer()
    profiler = TrainingProfiler()
    with profiler:
        hooks = HookList([ProfilerHook(ProfilerSpec(wait=0, warmup=1, active=2))])
        hooks.bind(_run(tmp_path, model, optimizer))
        _drive(hooks, model, optimizer, steps=3)
    assert "job's profiler spec is skipped" in capsys.readouterr().out
    assert not (tmp_path / "artifacts").exists()
    assert "aten::addmm" in profiler.key_averages().table()


def test_training_state_counts_o2_master_weights_once() -> None:
    import torch

    from ace3.config import TrainingConfig
    from ace3.runtime.loop.precision import resolve_precision
    from ace3.runtime.observe.state_size import training_state_bytes

    model = torch.nn.Linear(64, 64)  # 4160 parameters
    precision = resolve_precision(
        TrainingConfig(mixed_precision=True, amp_level="O2", amp_dtype="bfloat16"),
        torch.device("cpu"),
    )
    precision.prepare_model(model)
    optimizer = torch.optim.SGD(precision.optimizer_parameters(model), lr=0.1)
    # bf16 model weights (2 bytes) + float32 masters (4 bytes); no grads or state yet.
    assert training_state_bytes(model, optimizer) == 4160 * (2 + 4)
    plain = torch.nn.Linear(64, 64)
    shared = torch.optim.SGD(plain.parameters(), lr=0.1)
    assert training_state_bytes(plain, shared) == 4160 * 4  # the same tensors, counted once
