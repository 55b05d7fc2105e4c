"""EM capsules learn on the smallNORB stand-in, compared with the CNN trained the same way."""

from __future__ import annotations

import pytest

from capsnet.config import DataParams, Params, SmallnorbParams, SmallnorbSynthParams
from capsnet.config.training import TrainConfig
from capsnet.data import stages
from capsnet.training.run import RunSpec, load_test, train_run
from capsnet.training.scoring import accuracy

CHANCE = 0.2  # five classes


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory):
    """The stand-in rendered at 24x24 (a quarter of the pixels of 48x48) and prepared at
    the default size, 48, as the shrunk DVC project does."""
    root = tmp_path_factory.mktemp("norb") / "data"
    section = SmallnorbParams(source="synth", synth=SmallnorbSynthParams(side=24))
    params = Params(data=DataParams(smallnorb=section))
    stages.download("smallnorb", params, root)
    stages.prepare("smallnorb", params, root)
    return root


def _train(model: str, root, **train) -> float:
    config = TrainConfig(epochs=2, batch_size=32, seed=0, progress=False, device="cpu", **train)
    spec = RunSpec(
        model=model, train=config, dataset="smallnorb", train_size=512, val_size=0,
        data_root=root, overrides={"routing_iterations": 2} if model.startswith("em") else {},
    )  # fmt: skip
    result = train_run(spec)
    return accuracy(result.model, load_test(spec, limit=500), 250)["accuracy"]


@pytest.mark.slow
def test_em_learns_the_stand_in_well_above_chance(synth_root):
    em = _train(
        "em-capsnet-small", synth_root, loss="spread", lr=3e-3, weight_decay=2e-7, compile=True
    )
    cnn = _train("smallnorb-cnn", synth_root, loss="cross-entropy", lr=1e-3)
    print(f"smallnorb-synth test accuracy: em-capsnet-small {em:.3f}, smallnorb-cnn {cnn:.3f}")
    assert em > 2 * CHANCE, em
    assert cnn > 2 * CHANCE, cnn
    assert em > cnn - 0.25, (em, cnn)  # the capsules are not far behind the CNN
