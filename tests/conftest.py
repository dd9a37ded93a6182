import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RANKWISE_QUIET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from rankwise.core.progress import set_quiet  # noqa: E402

set_quiet(True)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """A private RANKWISE_CACHE so a test's cache files never touch the user's."""
    monkeypatch.setenv("RANKWISE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def smollm2():
    from rankwise.models import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def tokenizer():
    from rankwise.models import load_smollm2_tokenizer

    return load_smollm2_tokenizer()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
