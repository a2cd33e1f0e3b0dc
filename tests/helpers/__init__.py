"""Modules and scripts the tests share: toy environments, CPU trainer settings, servers and child-process scripts."""
