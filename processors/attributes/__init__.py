"""The attributes processor: attribute actions on spans, log records, metric data points and
profile samples, optionally only on those that match `include` and not `exclude`.

Modules: `config`, `matching` (include/exclude), `processor` (walking each signal's items).
"""
