"""What the tests share and what stands in for services no test can reach, one module per concern.

Test modules import from here, never from one another or from a conftest; fixtures live in the conftest.py files.
"""
