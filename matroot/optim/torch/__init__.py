"""The ``torch.optim.Optimizer`` shells: ``Shampoo`` (:mod:`.shampoo`, its state in
:mod:`.state`) and ``Muon`` (:mod:`.muon`)."""
