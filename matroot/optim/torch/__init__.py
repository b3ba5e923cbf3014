"""The ``torch.optim.Optimizer`` shells: ``Shampoo`` (:mod:`.shampoo`, its state in
:mod:`.state`), ``Muon`` (:mod:`.muon`) and ``SOAP`` (:mod:`.soap`)."""
