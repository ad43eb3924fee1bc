"""geoformers.model_io: saving, Hub code, strict loading and Hub export of the geoformers models
(docs/reliability.md). Not shipped in a saved folder: the model's forward does not need it."""
