"""The app's views (Streamlit), one module each; app.py shows them as tabs. Unlike the rest of viz/,
these draw pages, not pictures: only app.py imports them.

  step_player  the tiny model serving a crowd, static beside continuous, step by step
  whatif       a real model on a real card: memory, users, tokens/s, and a crowd served in simulation
  multicard    the what-if view's cards (tp) and link: the model split over several cards, and what they send
  live         a running server (python -m minillm serve), watched as requests arrive
  playback     the step player itself (controls, panels), shared by the views that replay traces
  headlines    a replaying view's big numbers: seats busy, or goodput when the requests carry targets
  presenter    the presenter view: the layout and sizes for a projector
  replays      the step player's runs, replayed from each prompt's recorded reply: a setting costs no forward
  fleet_run    two engines in this process, a fleet: replicas behind a router, or a prefill and a decode engine
  trace_files  a trace to and from a file: downloads, and an uploaded trace replayed

A new view is a module with a `show()` function and one line in app.py's VIEWS.
"""
