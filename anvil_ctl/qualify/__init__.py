"""Qualification: gates run against a candidate's endpoint, and a decision bound to it."""
