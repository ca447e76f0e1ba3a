"""External checkpoint series: hub revisions, run folders and monitor logs, through the features' one path.

Entry points: ``run.series_shards`` (every source of the ``series`` params -> shards and a status, what
the series stage runs); ``checkpoint.series_checkpoint_features`` (one external checkpoint -> rows);
``hub.hub_checkpoints`` (hub revisions to local files); ``run_folders.scan_run_folder`` (Trainer output
or plain safetensors files, and their losses); ``safetensors_reader.SafetensorsFile`` (one tensor at a time);
``api.features_of`` (a model or folder -> rows in one call, as ``topometrics.features_of``).
"""
