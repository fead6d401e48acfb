"""ace3.config.requirements: what an entry may be (a PEP 508 requirement by name), the one
canonical spelling environments are hashed from, requirements.txt read as pip reads it, and
the in-process check."""

from __future__ import annotations

import pytest

from ace3.config.requirements import (
    RequirementError,
    normalized_requirements,
    parse_requirement,
    read_requirements_txt,
    unmet_requirements,
)


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("git+https://github.com/x/y", "direct URLs"),
        ("tool @ https://example.com/tool-1.0.whl", "direct URLs"),
        ("tool @ file:///tmp/tool", "direct URLs"),
        ("./pkg", "local paths"),
        ("/abs/pkg", "local paths"),
        ("~/pkg", "local paths"),
        ("pkg-1.0-py3-none-any.whl", "local paths"),
        ("-e .", "pip options"),
        ("--index-url https://evil/simple", "pip options"),
        ("-r other.txt", "pip options"),
        ("einops==0.8 --hash=sha256:00", "per-requirement options"),
        ("einops bar", "not a PEP 508"),
        ("", "is empty"),
        ("x" * 400, "longer than"),
    ],
)
def test_everything_but_a_requirement_by_name_is_refused_naming_the_entry(
    entry: str, reason: str
) -> None:
    with pytest.raises(RequirementError, match=reason) as refused:
        parse_requirement(entry, source="config.requirements")
    assert str(refused.value).startswith("config.requirements entry ")


def test_one_canonical_sorted_spelling_with_extras_merged() -> None:
    merged = normalized_requirements(
        ("config.requirements", ["Einops >= 0.8", "timm[b]<2,>=1", "zope.interface"]),
        ("requirements.txt", ["einops>=0.8", "TIMM[a]>=1,<2", "tomli; python_version < '3.11'"]),
    )
    assert merged == [
        "einops>=0.8",
        "timm[a,b]<2,>=1",
        'tomli; python_version < "3.11"',
        "zope-interface",
    ]


def test_one_package_asked_for_two_ways_is_refused_naming_both() -> None:
    with pytest.raises(RequirementError) as refused:
        normalized_requirements(
            ("requirements.txt", ["einops==0.7.0"]), ("config.requirements", ["einops>=0.8"])
        )
    message = str(refused.value)
    assert "'einops>=0.8'" in message and "'einops==0.7.0'" in message


def test_requirements_txt_is_read_as_pip_reads_it() -> None:
    text = "# pinned\neinops>=0.8  # inline comment\n\ntimm\\\n==1.0\n\ttomli\n"
    assert read_requirements_txt(text) == ["einops>=0.8", "timm==1.0", "tomli"]
    with pytest.raises(RequirementError, match="pip options"):
        read_requirements_txt("einops\n--extra-index-url https://evil/simple\n")


def test_the_in_process_check_names_what_this_python_lacks() -> None:
    import torch

    unmet = unmet_requirements(
        ["numpy>=1", "torch==0.0.1", "surely-not-installed-pkg", "numpy; python_version < '3'"]
    )
    assert unmet == [
        f"torch {torch.__version__} is installed; 'torch==0.0.1' asks for another version",
        "surely-not-installed-pkg is not installed (asked for 'surely-not-installed-pkg')",
    ]
