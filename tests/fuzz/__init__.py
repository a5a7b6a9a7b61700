"""Fuzz targets for what pycollector reads from outside (this package holds no tests).

``targets`` holds the targets and the property each one checks; ``python -m tests.fuzz`` runs them
under atheris (libFuzzer, coverage-guided) for ``make fuzz``; ``seeds`` writes the seed corpus
kept in ``corpus/<target>/``; ``tests/test_fuzz.py`` replays the corpus and runs each target for
a few seconds. Nothing is imported here: the runner must import the code under test inside
atheris' instrumentation, which sees only modules imported after it starts.
"""
