"""The proto's rule that index 0 of every dictionary table is the zero value ("none"), applied
to senders that leave a table out entirely (an empty message, a profile with no mappings)."""

from __future__ import annotations

from opentelemetry.proto.profiles.v1development import profiles_pb2

TABLES = ("string_table", "attribute_table", "mapping_table", "function_table", "location_table", "stack_table", "link_table")


def with_zero_entries(dictionary: profiles_pb2.ProfilesDictionary) -> profiles_pb2.ProfilesDictionary:
    """``dictionary`` itself when every table has its zero entry, else a copy that has them."""
    empty = [name for name in TABLES if not getattr(dictionary, name)]
    if not empty:
        return dictionary
    completed = profiles_pb2.ProfilesDictionary()
    completed.CopyFrom(dictionary)
    for name in empty:
        table = getattr(completed, name)
        table.append("") if name == "string_table" else table.add()
    return completed
