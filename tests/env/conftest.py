import pytest

from hetrl.env.chat import ChatCodec
from hetrl.models.tokenizer import build_char_tokenizer


@pytest.fixture(scope="session")
def codec():
    return ChatCodec(build_char_tokenizer())


@pytest.fixture(scope="session")
def runner():
    from hetrl.env.execution import SandboxRunner

    r = SandboxRunner(workers=2)
    yield r
    r.close()
