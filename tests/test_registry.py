import pytest

from headprobe.registry import FAMILIES, Registry, UnknownNameError, split_prefixed


def test_lazy_entries_resolve_and_unknown_names_suggest():
    reg = Registry("widget")
    reg.add("sqrt", "math:sqrt", "square root")
    assert reg.get("sqrt")(9.0) == 3.0
    with pytest.raises(UnknownNameError, match=r"unknown widget 'sqrtt'; allowed: sqrt\. Did you mean 'sqrt'\?"):
        reg.get("sqrtt")
    with pytest.raises(ValueError, match="registered twice"):
        reg.add("sqrt", "math:sqrt", "again")


def test_every_registered_target_imports():
    for registry in FAMILIES.values():
        for entry in registry:
            assert callable(entry.load()), entry


def test_split_prefixed():
    backbones = FAMILIES["backbones"]
    assert split_prefixed("hf:facebook/dinov2-small", backbones) == ("hf", "facebook/dinov2-small")
    assert split_prefixed("offline:dinov2-vits14", backbones) == ("offline", "dinov2-vits14")
    with pytest.raises(UnknownNameError, match="Did you mean"):
        split_prefixed("hff:x", backbones)


def test_preset_and_sweep_families_list_exactly_the_names_the_code_defines():
    from headprobe.data.augment import PRESETS, augment_spec
    from headprobe.probes.orbits import ORBIT_SWEEPS, sweep_values

    assert FAMILIES["augment"].names() == list(PRESETS)
    assert FAMILIES["sweeps"].names() == list(ORBIT_SWEEPS)
    assert FAMILIES["augment"].get("dino") is augment_spec and FAMILIES["sweeps"].get("hue") is sweep_values
