"""Fakes of every port, for unit tests and for users who test their own integrations."""
