"""topometrics.series.api: topometrics.features_of refuses what it cannot measure in one line."""

import pytest


def test_features_of_anything_else_is_one_line_saying_what_it_accepts(tmp_path):
    import topometrics
    from topometrics.errors import TopometricsError
    from topometrics.series.api import ACCEPTS

    things = [(object(), "got a object"), (tmp_path / "absent", "is not a folder"), (tmp_path, "no checkpoint")]
    for thing, start in things:
        with pytest.raises(TopometricsError) as err:
            topometrics.features_of(thing)
        assert start in str(err.value) and str(err.value).endswith(f"it accepts {ACCEPTS}")
        assert "\n" not in str(err.value)
