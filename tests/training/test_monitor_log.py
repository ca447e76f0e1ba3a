"""topometrics.training.monitor_log: the monitor's log spells the features schema as the features stage does."""

from topometrics import vocabulary
from topometrics.features import checkpoint
from topometrics.training import monitor_log


def test_the_log_spells_the_features_schema_as_the_features_do():
    # monitor_log imports no measure (training imports it), so it spells these two facts itself
    assert monitor_log.ROW_COLUMNS == checkpoint.FEATURE_COLUMNS and monitor_log.MODEL_LAYER == vocabulary.ALL
    assert all(vocabulary.lookup(name) is not None for name in monitor_log.SHOWN)
