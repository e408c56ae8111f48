"""The epp command line: flags, logging, composing and running the components."""
