"""Tests of the offloading core, laid out like offload/."""
