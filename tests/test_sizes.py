"""The one size grammar (workbench.sizes): every spelling it takes, every one it refuses, and the
two CLIs that read ``--fusion-bytes`` agreeing with it."""
from __future__ import annotations

import pytest

from workbench.sizes import format_size, parse_fusion_bytes, parse_size


@pytest.mark.parametrize("text,nbytes", [
    ("4096", 4096), ("4096B", 4096), ("1b", 1),
    ("64K", 65536), ("64k", 65536), ("64KB", 65536), ("64KiB", 65536), ("64kib", 65536), ("64 KiB", 65536),
    ("1M", 1 << 20), ("1.5M", 3 << 19), ("0.5K", 512), ("1.25K", 1280), ("8M", 8 << 20),
    ("1G", 1 << 30), ("1GiB", 1 << 30), ("2T", 2 << 40), ("  8M ", 8 << 20),
])
def test_sizes_it_reads(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["0", "0K", "1.5", "0.1K", "1e6", "-4", "+4", "64KK", "B", "KiB", "iB", "64iB",
                                  "1.", ".5K", "64 K B", "lots", "", "4K,8K", "٣"])
def test_what_is_no_size_is_refused_on_one_line_naming_the_grammar(text):
    with pytest.raises(ValueError) as info:
        parse_size(text)
    message = str(info.value)
    assert message == f"{text!r} is not a size: write bytes > 0 like 4096, 64K, 1.5M or 1GiB (K = 1024)"
    assert "\n" not in message


@pytest.mark.parametrize("nbytes", [1, 1000, 4096, 65536, 3 << 19, 1 << 30, (1 << 30) + 1])
def test_format_size_reads_back(nbytes):
    assert parse_size(format_size(nbytes)) == nbytes


@pytest.mark.parametrize("text,value", [
    ("inf", None), ("INF", None), ("none", None), (" None ", None),
    ("0", 0), ("0K", 0), ("4096", 4096), ("64K", 65536), ("1.5M", 3 << 19),
])
def test_fusion_bytes(text, value):
    assert parse_fusion_bytes(text) == value


@pytest.mark.parametrize("text", ["lots", "-4", "step", "infinity", "1.5", ""])
def test_bad_fusion_bytes_name_what_is_allowed(text):
    with pytest.raises(ValueError, match=r"^must be 0 \(one message per tensor\), inf or none \(one message "
                                         r"per step\), or a size like 4096, 64K, 1.5M; got "):
        parse_fusion_bytes(text)


@pytest.mark.parametrize("text", ["inf", "none", "0", "64K", "1.5M"])
def test_train_and_predict_read_fusion_bytes_as_the_grammar_does(text):
    from workbench.cli import build_parser
    for argv in (["predict"], ["train", "--algorithm", "sync-sgd"]):
        assert build_parser().parse_args([*argv, "--fusion-bytes", text]).fusion_bytes == parse_fusion_bytes(text)


def test_predict_keeps_a_presets_buckets_unless_fusion_bytes_is_given():
    import argparse

    from workbench.cli.predict import _options, add_to
    parser = argparse.ArgumentParser()
    add_to(parser.add_subparsers())

    def fusion(*argv):
        return _options(parser.parse_args(["predict", *argv])).get("fusion_bytes", "absent")
    assert fusion("--preset", "fused") == 1 << 20   # the preset's buckets
    assert fusion("--preset", "fused", "--fusion-bytes", "inf") is None
    assert fusion("--preset", "fused", "--fusion-bytes", "none") is None
    assert fusion("--preset", "fused", "--fusion-bytes", "0") == 0
    assert fusion("--fusion-bytes", "64K") == 65536
    assert fusion() == "absent"   # the model's default, as before
