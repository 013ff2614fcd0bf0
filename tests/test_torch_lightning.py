"""tectofs.lightning: a Lightning Trainer checkpoints to tectofs:// and resumes from there."""

from __future__ import annotations

import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch")

from lightning.pytorch import LightningModule  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

import tectofs.torch as tt  # noqa: E402
from tectofs.lightning import TectofsCheckpointIO  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]


class _Tiny(LightningModule):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(width, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        g = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))
        return torch.utils.data.DataLoader(data, batch_size=4)


def _trainer(tmp_path: Any, run: str, max_steps: int) -> Any:
    return L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=str(tmp_path), plugins=[TectofsCheckpointIO()],
                     callbacks=[ModelCheckpoint(dirpath=run, every_n_train_steps=2, save_top_k=1, save_last=True)])


def test_trainer_saves_to_tectofs_and_resumes(cluster: Any, tmp_path: Any) -> None:
    run = f"tectofs://{cluster.address}/lightning-tests/run-{os.getpid()}"
    torch.manual_seed(0)
    model = _Tiny()
    _trainer(tmp_path, run, max_steps=4).fit(model)
    names = sorted(cluster.fs.listdir(tt.parse(run).path))
    assert names == ["epoch=0-step=4.ckpt", "last.ckpt"], names  # step 2's was removed (save_top_k=1)
    saved = tt.load(f"{run}/last.ckpt", weights_only=False)
    assert saved["global_step"] == 4 and torch.equal(saved["state_dict"]["layer.weight"], model.layer.weight.detach())

    resumed = _Tiny()
    trainer = _trainer(tmp_path, run, max_steps=6)
    trainer.fit(resumed, ckpt_path=f"{run}/last.ckpt")
    assert trainer.global_step == 6
    assert sorted(cluster.fs.listdir(tt.parse(run).path)) == ["epoch=1-step=6.ckpt", "last.ckpt"]

    local = tmp_path / "local.ckpt"  # other paths: Lightning's own TorchCheckpointIO
    TectofsCheckpointIO().save_checkpoint({"a": torch.ones(2)}, local)
    assert torch.equal(TectofsCheckpointIO().load_checkpoint(local, weights_only=True)["a"], torch.ones(2))
    TectofsCheckpointIO().remove_checkpoint(local)
    assert not local.exists()
