"""Appending one ``ProfilesData`` to another: its dictionary, and every index that refers into it.

``append(dst, src)``, the batch processor's merge: src's tables go after dst's, without src's zero
entries, and each index src holds moves by its table's offset; index 0 ("none") stays 0. No entry
is looked up or compared, so a batch holds an entry once per message that had it, which the format
allows. ``check(src)`` raises the ValueError ``append`` would, for the message a batch starts with
and may pass on as it is. (``pycollector.pdata.merging`` re-interns instead, so that each entry is
held once.)

How ``append`` stays fast in Python. Touching a field of a repeated message element is a round trip
into upb of a few hundred nanoseconds, and a message of a few thousand samples has a hundred
thousand index fields, so ``append`` touches no element. It serializes src once and reads the bytes
back through shadow message types (``shadow.TYPES``) that see each dictionary table as a list of
serialized entries. A table's entries, joined behind markers, are parsed as one message whose
repeated fields collect one field of every entry each ("columns"); serialized and split at the
markers, each column gives every entry's bytes of that field ("pieces"), all in C. Dicts from a
piece to its moved bytes, built in bulk from encoded varints, move the indices; entries are joined
again from their pieces and go into dst with one ``MergeFromString``. The location indices of
stacks, half of all indices, move as lanes of one big integer instead. Costs are in
bench/merge_speed.py.

The modules: ``shadow`` (the message types), ``varints`` (encoding and reading varints),
``columns`` (cutting entries into pieces), ``moves`` (a table's source index -> destination index,
as dicts of pieces) and ``tables`` (each table's entries moved); this one plans the moves and
puts the message together.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata.appending.moves import Move, Outside
from pycollector.pdata.appending.shadow import TYPES
from pycollector.pdata.appending.tables import (
    moved_attributes,
    moved_functions,
    moved_locations,
    moved_mappings,
    moved_samples,
    moved_stacks,
)
from pycollector.pdata.validate import validate_indices
from pycollector.pdata.zero_entries import TABLES

__all__ = ["append", "check", "outside_error"]

# -- append ---------------------------------------------------------------------------------------

# The tables whose index 0 a table's zero entry holds: a mapping's, function's and attribute's
# strings, a location's mapping. The proto asks for string_table[0] to be "", but a sender may
# write another string there, which src's zero mapping then names and dst's does not.
_ZERO_REFERS_TO = {
    "attribute_table": ("string_table",),
    "mapping_table": ("string_table",),
    "function_table": ("string_table",),
    "location_table": ("mapping_table",),
}


def _moves(dst: profiles_pb2.ProfilesDictionary, tables: Any, out: Any) -> tuple[dict[str, Move], dict[str, list[bytes]]]:
    """Per table, where src's indices go, and src's entries to append to dst's.

    src's zero entry is dropped when both tables start with the zero value (a table left out
    counts as one) and the zero entries it refers to are dropped too; else every src entry is
    kept (a table left out as its zero entry), and every index moves, 0 too. A dst table left out
    gets its zero entry first, in ``out``."""
    moves, entries = {}, {}
    for name in TABLES:  # in an order where the tables a zero entry refers to come before it
        # A table src leaves out holds its zero entry, which may have to be appended.
        mine, theirs = getattr(dst, name), list(getattr(tables, name)) or [b""]
        size = len(mine)
        if not size:
            getattr(out, name).append(b"")
            size = 1
        mine_zero = not mine or (mine[0] == "" if name == "string_table" else mine[0].ByteSize() == 0)
        # A zero entry means what the zero entries it refers to mean: src's is dst's only if those are.
        referred = all(moves[table].drop_zero for table in _ZERO_REFERS_TO.get(name, ()))
        drop = mine_zero and theirs[0] == b"" and referred
        moves[name] = Move(name, len(theirs), size - 1 if drop else size, drop)
        entries[name] = theirs[1:] if drop else theirs
    return moves, entries


def _move_profile(profile: Any, strings: Move, attributes: Move) -> None:
    for value_type in (profile.sample_type, profile.period_type):
        for field in ("type_strindex", "unit_strindex"):
            index = getattr(value_type, field)
            if strings(index) != index:
                setattr(value_type, field, strings(index))
    if profile.attribute_indices:
        profile.attribute_indices[:] = [attributes(index) for index in profile.attribute_indices]


def outside_error(src: Message) -> ValueError:
    problems = validate_indices(src)
    first = problems[0] if problems else "an index is outside its table"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return ValueError(f"profiles refer outside their dictionary: {first}{more}; validate_indices() lists them all")


def append(dst: profiles_pb2.ProfilesData, src: Message) -> None:
    """Append src's resource profiles to dst's, and src's dictionary entries after dst's.

    src, a ProfilesData or ExportProfilesServiceRequest, is only read. Raises ValueError, and dst
    stays as it was, when src refers outside its own dictionary."""
    data = TYPES["Data"].FromString(src.SerializeToString())
    out = TYPES["Tables"]()
    try:
        move, entries = _moves(dst.dictionary, TYPES["Tables"].FromString(data.dictionary), out)
        strings, attributes = move["string_table"], move["attribute_table"]
        profiles, samples = [], []
        for resource in data.resource_profiles:
            for scope in resource.scope_profiles:
                for profile in scope.profiles:
                    _move_profile(profile, strings, attributes)
                    profiles.append((profile, len(profile.samples)))
                    samples.extend(profile.samples)
        if samples:
            moved = iter(moved_samples(samples, move["stack_table"], attributes, move["link_table"]))
            for profile, count in profiles:
                if count:
                    del profile.samples[:]
                    profile.samples.extend(itertools.islice(moved, count))
        tables = {"string_table": entries["string_table"], "link_table": entries["link_table"]}
        if entries["attribute_table"]:
            tables["attribute_table"] = moved_attributes(entries["attribute_table"], strings)
        if entries["function_table"]:
            tables["function_table"] = moved_functions(entries["function_table"], strings)
        if entries["mapping_table"]:
            tables["mapping_table"] = moved_mappings(entries["mapping_table"], strings, attributes)
        if entries["location_table"]:
            tables["location_table"] = moved_locations(
                entries["location_table"], move["mapping_table"], move["function_table"], attributes
            )
        tables["stack_table"] = moved_stacks(entries["stack_table"], move["location_table"])
    except Outside:
        raise outside_error(src) from None
    except (DecodeError, IndexError) as error:
        raise ValueError(f"profiles could not be read: {error!r}") from error
    for name, table in tables.items():
        getattr(out, name).extend(table)
    data.dictionary = out.SerializeToString()
    dst.MergeFromString(data.SerializeToString())


# -- check ----------------------------------------------------------------------------------------


def check(src: Message, serialized: bytes | None = None) -> None:
    """Raise the ValueError ``append(dst, src)`` would, merging nothing. ``serialized``:
    ``src.SerializeToString()``, when the caller has it already."""
    sizes = {name: max(len(getattr(src.dictionary, name)), 1) for name in TABLES}
    try:
        data = TYPES["CheckData"].FromString(src.SerializeToString() if serialized is None else serialized)
    except DecodeError as error:  # a field of the wrong wire type, which the message's own class skips
        raise ValueError(f"profiles could not be read: {error!r}") from error
    d = data.dictionary
    # Lists of uint64, which read a negative index as a huge one, and of int32.
    unsigned: list[tuple[Sequence[int], str]] = [
        (d.mapping_table.filename_strindex, "string_table"),
        (d.mapping_table.attribute_indices, "attribute_table"),
        (d.location_table.mapping_index, "mapping_table"),
        (d.location_table.lines.function_index, "function_table"),
        (d.location_table.attribute_indices, "attribute_table"),
        (d.function_table.name_strindex, "string_table"),
        (d.function_table.system_name_strindex, "string_table"),
        (d.function_table.filename_strindex, "string_table"),
        (d.attribute_table.key_strindex, "string_table"),
        (d.attribute_table.unit_strindex, "string_table"),
        (d.stack_table.values, "location_table"),
    ]
    signed: list[tuple[Sequence[int], str]] = []
    for resource in data.resource_profiles:
        for scope in resource.scope_profiles:
            for profile in scope.profiles:
                samples, types = profile.samples, (profile.sample_type, profile.period_type)
                unsigned += [
                    (samples.stack_index, "stack_table"),
                    (samples.attribute_indices, "attribute_table"),
                    (samples.link_index, "link_table"),
                ]
                signed += [
                    ([index for t in types for index in (t.type_strindex, t.unit_strindex)], "string_table"),
                    (profile.attribute_indices, "attribute_table"),
                ]
    if any(max(values[:], default=0) >= sizes[table] for values, table in unsigned) or any(
        values and (max(values) >= sizes[table] or min(values) < 0) for values, table in signed
    ):
        raise outside_error(src)
