"""Re-read a file when it changes: the one implementation is in the data layer (``file-discovery``
reloads its endpoints file with it too); the datastore's files use it from here."""

from epp.datalayer.watch import WatchedFile

__all__ = ["WatchedFile"]
