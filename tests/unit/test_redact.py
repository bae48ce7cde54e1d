"""Credentials removed from text that leaves a process (verification reports, tool
outputs): every kind the scrubber knows, the process's own secrets, and ordinary text
left alone."""

from __future__ import annotations

import pytest

from kernelflow.common.redact import MASK, scrub, secret_values


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("connect to nats://kf:hunter2pass@10.0.0.5:4222 failed", "hunter2pass"),
        ("GET https://user:pa55word@api.example.com/v1", "pa55word"),
        ("https://x-access-token@github.com/o/r", "x-access-token"),
        ("key sk-ant-api03-abcdefghijklmnopqrstuvwx was refused", "abcdefghijklmnopqrstuvwx"),
        ("OPENAI_API_KEY=sk-proj-ABCDEFGHIJKLMNOPQRSTUV", "ABCDEFGHIJKLMNOPQRSTUV"),
        ("aws AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE"),
        ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdefghij"),
        ("Authorization: Bearer abc.def-ghi_jkl123", "abc.def-ghi_jkl123"),
        ('{"api_key": "k3y-v4lue-123"}', "k3y-v4lue-123"),
        ("password = 'correct horse'", "correct"),
        ("seed SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU", "SUAMLK2ZNL35"),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpM", "SflKx"),
    ],
)
def test_credentials_of_every_known_kind_are_masked(text: str, secret: str) -> None:
    cleaned = scrub(text, secrets=())
    assert secret not in cleaned
    assert MASK in cleaned


def test_the_processs_own_secrets_are_masked_wherever_they_appear() -> None:
    environ = {
        "ANTHROPIC_API_KEY": "plain-looking-value-42",
        "KF_NATS_URL": "nats://daemon:s3cretpw@nats.internal:4222,nats://daemon:s3cretpw@b:4222",
        "KF_LLM": "openai:http://bob:llmpass99@vllm:8000/v1#qwen",
        "HOME": "/home/someone",
        "TOKEN_COUNT": "12",  # too short to be taken for a secret
    }
    secrets = secret_values(environ)
    assert {"plain-looking-value-42", "s3cretpw", "daemon", "llmpass99"} <= set(secrets)
    assert "/home/someone" not in secrets and "12" not in secrets
    said = "read plain-looking-value-42 from the env; password is s3cretpw (llmpass99)"
    cleaned = scrub(said, secrets)
    for value in ("plain-looking-value-42", "s3cretpw", "llmpass99"):
        assert value not in cleaned


@pytest.mark.parametrize(
    "text",
    [
        'Traceback (most recent call last):\n  File "candidate.py", line 12, in forward',
        "tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)",
        "max_tokens=1000 temperature=0.2",
        "output[3, 7]: expected 0.125, got -0.5",
        "see https://triton-lang.org/main/index.html",
        "RuntimeError: shape '[16, 1000]' is invalid for input of size 15000",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert scrub(text, secrets=()) == text
