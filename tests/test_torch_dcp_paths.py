"""How DCP reaches tectofs: the hooks' guards, failures told cause first, failed saves
cleaned up, format conversions, and ``async_save`` in PROCESS mode with a lazily imported
plugin. A real local cluster; the PROCESS test runs in a subprocess of its own (it needs a
process group, which would leak into other tests here)."""

from __future__ import annotations

import inspect
import os
import socket
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint import _storage_utils, state_dict_loader, state_dict_saver  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import tectofs.torch as tt  # noqa: E402
from tectofs.torch import _hook  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

from tests.test_torch_plugin import _run_dir  # noqa: E402


def _leftovers(cluster: Any, run: str) -> list[str]:
    return [n for n in cluster.fs.listdir(tt.parse(run).path) if ".pending-" in n]


# -- the hooks' guards ----------------------------------------------------------------------


def test_private_hook_signature_is_the_one_we_rely_on() -> None:
    """Fails loudly when a torch upgrade changes DCP's private chooser: then the guarded hook
    is refused (a warning at import), and this test says to look at tectofs/torch/_hook.py."""
    original = getattr(_storage_utils._storage_setup, "__wrapped__")  # set by the installed hook (functools.wraps)
    assert _hook._plain_signature(original) == _hook.STORAGE_SETUP_SIGNATURE, (
        "torch changed torch.distributed.checkpoint._storage_utils._storage_setup: update tectofs/torch/_hook.py"
    )
    for module_name, name, keywords in _hook.PUBLIC_ENTRY_POINTS:
        params = inspect.signature(getattr(sys.modules[module_name], name)).parameters
        assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in keywords), (module_name, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _hook.install() is True  # idempotent, and nothing refused on this torch
    for module in (_storage_utils, state_dict_saver, state_dict_loader):
        assert getattr(module._storage_setup, _hook._MARK, False), module
    assert getattr(dcp.save, _hook._MARK) and getattr(dcp.load, _hook._MARK) and getattr(dcp.async_save, _hook._MARK)


def test_hooks_hand_what_they_do_not_own_to_the_original(tmp_path: Any) -> None:
    calls: list[tuple] = []

    def future_storage_setup(storage: Any, checkpoint_id: Any, reader: bool = False, *, layout: str = "") -> str:
        calls.append((storage, checkpoint_id, reader, layout))
        return "original"

    wrapper = _hook._wrap_storage_setup(future_storage_setup)
    assert wrapper(None, str(tmp_path), reader=True, layout="new") == "original"  # extra keyword: untouched
    assert wrapper(None, "tectofs://h:1/x", True, layout="new") == "original"  # does not bind: not ours
    assert calls == [(None, str(tmp_path), True, "new"), (None, "tectofs://h:1/x", True, "new")]
    assert isinstance(wrapper(None, "tectofs://h:1/x", True), tt.CheckpointReader)

    # The installed wrapper, with a keyword DCP may add one day, for a local checkpoint:
    # it reaches the original, which (today) is the one to refuse it (the wrapper takes anything).
    with pytest.raises(TypeError, match=r"^_storage_setup\(\) got an unexpected keyword argument 'future_option'"):
        # An unknown keyword on purpose: the original is to refuse it.
        state_dict_saver._storage_setup(None, str(tmp_path / "c"), reader=False, future_option=1)  # type: ignore[call-arg]
    assert type(state_dict_saver._storage_setup(None, str(tmp_path / "c"))).__name__ == "FileSystemWriter"
    # ... and the public wrappers pass local saves and loads through unchanged.
    sd = {"w": torch.arange(4.0)}
    dcp.save(sd, checkpoint_id=str(tmp_path / "local"), no_dist=True)
    out = {"w": torch.zeros(4)}
    dcp.load(out, checkpoint_id=str(tmp_path / "local"), no_dist=True)
    assert torch.equal(out["w"], sd["w"])


def test_unknown_private_signature_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed(storage: Any, checkpoint_id: Any, reader: bool = False, options: Any = None) -> None:
        raise AssertionError("never called here")

    for module in (_storage_utils, state_dict_saver, state_dict_loader):
        monkeypatch.setattr(module, "_storage_setup", changed)
    with pytest.warns(RuntimeWarning, match=r"not hooking _storage_setup \(its signature is .*options"):
        assert _hook.install() is False
    assert state_dict_saver._storage_setup is changed  # left alone


# -- failures -------------------------------------------------------------------------------


def test_failure_message_starts_with_rank_operation_path_and_server(cluster: Any) -> None:
    run = _run_dir(cluster, "cause")
    run_path = tt.parse(run).path
    cluster.fs.mkdir(run_path, parents=True)
    cluster.fs.write_bytes(f"{run_path}/not-a-dir", b"x")
    with pytest.raises(CheckpointException) as excinfo:
        dcp.save({"w": torch.zeros(3)}, checkpoint_id=f"{run}/not-a-dir/step_1")
    message = str(excinfo.value)
    assert isinstance(excinfo.value, tt.CheckpointFailed)
    assert message.startswith(f"rank 0: stat {run_path}/not-a-dir/step_1 on {cluster.address} failed: NotADirectory: "), message
    assert "CheckpointException ranks" in message  # DCP's per-rank detail follows
    (exc, _), = excinfo.value.failures.values()
    assert isinstance(exc, OSError)  # the client's own error, untouched

    class VanishingPending(tt.CheckpointWriter):
        """Someone deletes the pending directory between planning and writing."""

        def prepare_global_plan(self, plans: Any) -> Any:
            plans = super().prepare_global_plan(plans)
            cluster.fs.rmtree(plans[0].storage_data.pending)
            return plans

    with pytest.raises(tt.CheckpointFailed) as excinfo:
        dcp.save({"w": torch.zeros(3)}, storage_writer=VanishingPending(f"{run}/step_2"))
    first = str(excinfo.value).splitlines()[0]
    assert first.startswith(f"rank 0: write file {run_path}/.step_2.pending-") and "/__0_0.distcp on " in first, first
    assert f"on {cluster.address} failed: NotFound" in first, first

    with pytest.raises(tt.CheckpointFailed, match=rf"^rank 0: read file {run_path}/nothing/.metadata on {cluster.address}"):
        dcp.load({"w": torch.zeros(3)}, checkpoint_id=f"{run}/nothing")


def test_failed_save_removes_its_pending_directory(cluster: Any) -> None:
    run = _run_dir(cluster, "failed")
    unsaveable = {"w": torch.ones(8), "s": torch.eye(3).to_sparse()}  # refused by the writer mid-write
    with pytest.raises(CheckpointException, match="cannot be checkpointed"):
        dcp.save(unsaveable, checkpoint_id=f"{run}/step_1")
    writer = tt.CheckpointWriter(f"{run}/step_2")
    with pytest.raises(CheckpointException):
        dcp.save(unsaveable, storage_writer=writer)
    assert _leftovers(cluster, run) == []
    assert not cluster.fs.exists(tt.parse(f"{run}/step_1").path)
    dcp.save({"w": torch.ones(8)}, storage_writer=writer)  # the same writer saves fine afterwards
    assert tt.latest(run) == f"{run}/step_2"


def test_gc_defaults_agree() -> None:
    from tectofs.cli import build_parser

    cli_default = build_parser().parse_args(["gc"]).older_than
    assert cli_default == tt.PENDING_GRACE_S == 24 * 3600
    assert inspect.signature(tt.gc_pending).parameters["older_than_s"].default == tt.PENDING_GRACE_S
    assert tt.CheckpointWriter().pending_grace_s == tt.PENDING_GRACE_S


# -- conversions ----------------------------------------------------------------------------


def test_dcp_to_torch_save_and_back(cluster: Any, tmp_path: Any) -> None:
    run = _run_dir(cluster, "convert")
    torch.manual_seed(0)
    sd: dict[str, Any] = {"model": {"w": torch.randn(5, 7), "b": torch.randn(7).to(torch.bfloat16)}, "step": 12,
                          "cfg": {"lr": 0.1}}
    dcp.save(sd, checkpoint_id=f"{run}/step_12")

    local = tmp_path / "model.pt"
    tt.dcp_to_torch_save(f"{run}/step_12", local)
    flat = torch.load(local, weights_only=False)
    assert torch.equal(flat["model"]["w"], sd["model"]["w"]) and torch.equal(flat["model"]["b"], sd["model"]["b"])
    assert flat["step"] == 12 and flat["cfg"] == {"lr": 0.1}

    tt.torch_save_to_dcp(local, f"{run}/step_13")
    tt.dcp_to_torch_save(f"{run}/step_13", f"{run}/model.pt")  # the single file on tectofs too
    again = tt.load(f"{run}/model.pt", weights_only=False)
    assert torch.equal(again["model"]["w"], sd["model"]["w"]) and again["step"] == 12
    tt.torch_save_to_dcp(f"{run}/model.pt", f"{run}/step_14")
    out: dict[str, Any] = {"model": {"w": torch.zeros(5, 7), "b": torch.zeros(7, dtype=torch.bfloat16)}, "step": 0,
                           "cfg": {"lr": 0.0}}
    dcp.load(out, checkpoint_id=f"{run}/step_14")
    assert torch.equal(out["model"]["w"], sd["model"]["w"]) and out["step"] == 12
    with pytest.raises(CheckpointException, match="already exists"):
        tt.torch_save_to_dcp(local, f"{run}/step_14")


# -- async_save in PROCESS mode -------------------------------------------------------------

_PROCESS_SCRIPT = textwrap.dedent("""
    import os, sys, warnings
    from datetime import timedelta
    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    def main(run):
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0, world_size=1,
                                timeout=timedelta(seconds=30))
        import tectofs.torch  # lazily: only this process has it; DCP's background process does not
        sd = {"w": torch.arange(1000.0), "step": 7}
        for step in (1, 2):
            future = dcp.async_save(sd, checkpoint_id=f"{run}/step_{step}",
                                    async_checkpointer_type=AsyncCheckpointerType.PROCESS)
            future.result(timeout=60)
        try:
            dcp.async_save(sd, checkpoint_id=f"{run}/step_2",
                           async_checkpointer_type=AsyncCheckpointerType.PROCESS).result(timeout=60)
            raise SystemExit("saving over an existing checkpoint did not fail")
        except tectofs.torch.CheckpointFailed as exc:
            assert str(exc).startswith("rank 0: ") and "already exists" in str(exc).splitlines()[0], str(exc)
        out = {"w": torch.zeros(1000), "step": 0}
        dcp.load(out, storage_reader=tectofs.torch.CheckpointReader(f"{run}/step_2"))
        assert torch.equal(out["w"], sd["w"]) and out["step"] == 7
        dist.destroy_process_group()
        print("PROCESS-OK", tectofs.torch.latest(run))

    main(sys.argv[1])
""")


def test_async_save_process_mode_with_checkpoint_id_only(cluster: Any, tmp_path: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = _run_dir(cluster, "process")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", _PROCESS_SCRIPT, run, str(port)], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert f"PROCESS-OK {run}/step_2" in proc.stdout
    assert tt.checkpoints(run) == [f"{run}/step_1", f"{run}/step_2"] and _leftovers(cluster, run) == []
    meta_names = cluster.fs.listdir(tt.parse(f"{run}/step_1").path)
    assert all(n == ".metadata" or n.startswith("__0_") for n in meta_names), meta_names  # our format, not fsspec's
