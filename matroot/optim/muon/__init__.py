"""The functional core of Muon (:mod:`.core`)."""
