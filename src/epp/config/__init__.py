"""The EndpointPickerConfig file format: its models (``schema``, low in the layers, so each concept's
assembly reads its own section) and reading text into them (``load``, the llm-d layout in ``llmd``,
feature gates in ``features``).  Building the EPP from a config is ``epp.app``'s."""
