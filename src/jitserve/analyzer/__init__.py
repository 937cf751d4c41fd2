"""The request analyzer (JITServe paper section 4.1): length upper bounds and stage shares.

Data flow and who owns each stage:
- :mod:`.corpus` generates the synthetic training data (prompts with output lengths,
  compound programs with stage times); real completions replace it as they arrive;
- :mod:`.features` turns a request into feature rows (pure);
- :mod:`.qrf_train` trains quantile regression forests, :mod:`.qrf_model` answers length
  bounds from them, refined as tokens are generated; :class:`.qrf.QRFEstimator` is the
  in-process ``LengthEstimator`` (simulator, sidecar fallback);
- :mod:`.graphs` and :mod:`.matcher` keep the pattern-graph history of finished programs
  and match programs in flight; :class:`.matcher.PatternMatcher` is the in-process
  ``StageShareEstimator``;
- :mod:`.state` checkpoints the model, the observation buffer and the history;
- :mod:`.service_core` holds the service's state and background retraining and
  checkpointing, :mod:`.service` serves all of it over gRPC (proto in ``proto/``;
  settings in :mod:`.service_config`), :mod:`.client` calls it with deadlines and a local
  fallback;
- :mod:`.evaluate` measures it (``jitserve analyzer eval``), :mod:`.cli` is the command line.

Importing this package loads nothing heavy; import the submodule you need.
"""
