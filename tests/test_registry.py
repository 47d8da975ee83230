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
    from headprobe.data.augment import AugmentSpec
    from headprobe.data.orbits import OrbitSweep
    from headprobe.stats.claims import Question
    from headprobe.stats.geometry_claims import GeometryQuestion

    # these families register the definitions
    definitions = {"augment": AugmentSpec, "sweeps": OrbitSweep, "questions": (Question, GeometryQuestion)}
    for family, registry in FAMILIES.items():
        for entry in registry:
            loaded = entry.load()
            assert isinstance(loaded, definitions[family]) if family in definitions else callable(loaded), entry


def test_questions_are_declared_once():
    """claim 5's questions are the registry's first entries, the same objects `stats.claims` answers, and the keys
    a metric may bear on (`registry.PROBE_QUESTIONS`)."""
    from headprobe.registry import PROBE_QUESTIONS
    from headprobe.stats.claims import QUESTIONS

    declared = FAMILIES["questions"]
    assert tuple(declared.names()[:3]) == tuple(QUESTIONS) == PROBE_QUESTIONS
    assert all(declared.get(key) is QUESTIONS[key] for key in QUESTIONS)
    assert declared.entry("Q-class").help.startswith("claim 5: Does the head keep the class information? primary "
                                                     "linear.acc; equivalence: |head − backbone| < 0.02")
    assert "direction: head − backbone < 0;" in declared.entry("Q-aug").help


def test_split_prefixed():
    backbones = FAMILIES["backbones"]
    assert split_prefixed("hf:facebook/dinov2-small", backbones) == ("hf", "facebook/dinov2-small")
    assert split_prefixed("offline:dinov2-vits14", backbones) == ("offline", "dinov2-vits14")
    with pytest.raises(UnknownNameError, match="Did you mean"):
        split_prefixed("hff:x", backbones)


def test_preset_and_sweep_families_list_exactly_the_names_the_code_defines():
    from headprobe.data.augment import PRESETS, augment_spec
    from headprobe.data.orbits import orbit_sweep
    from headprobe.probes.orbits import ORBIT_SWEEPS

    assert FAMILIES["augment"].names() == list(PRESETS)
    assert FAMILIES["sweeps"].names() == list(ORBIT_SWEEPS)
    assert all(FAMILIES["augment"].get(name) is PRESETS[name] == augment_spec(name) for name in PRESETS)
    assert all(FAMILIES["sweeps"].get(name) is ORBIT_SWEEPS[name] is orbit_sweep(name) for name in ORBIT_SWEEPS)


def test_a_preset_or_sweep_registered_with_something_else_is_refused_by_name():
    from headprobe.data.augment import augment_spec
    from headprobe.data.orbits import orbit_sweep

    FAMILIES["augment"].add("wrong", "math:sqrt", "a function, not an AugmentSpec")
    FAMILIES["sweeps"].add("wrong", "math:sqrt", "a function, not an OrbitSweep")
    try:
        with pytest.raises(ValueError, match=r"registered with math:sqrt, which is a builtin_function_or_method, not "
                                             r"an AugmentSpec; register the AugmentSpec itself"):
            augment_spec("wrong")
        with pytest.raises(ValueError, match=r"not an OrbitSweep; register the OrbitSweep itself"):
            orbit_sweep("wrong")
    finally:
        FAMILIES["augment"].remove("wrong")
        FAMILIES["sweeps"].remove("wrong")
