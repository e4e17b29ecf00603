"""Fault injection and checking: tools that break things on purpose, for tests and chaos runs.

    proxy    FaultProxy: a TCP proxy that black-holes, cuts, delays or drops on command"""
