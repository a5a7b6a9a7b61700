"""Attribute actions (insert, update, upsert, delete, hash, extract, convert) as Go's
``attraction`` package has them, shared by the resource and attributes processors.

Modules: `config` (one action and its validation), `actions` (applying a list of them),
`values` (hashing, converting and printing values as Go does). Not a component itself.
"""
