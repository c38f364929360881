"""The app's views (Streamlit), one module each; app.py shows them as tabs. Unlike the rest of viz/,
these draw pages, not pictures: only app.py imports them.

  step_player  the tiny model serving a crowd, static beside continuous, step by step
  whatif       a real model on a real card: memory, users, tokens/s, and a crowd served in simulation
  live         a running server (python -m minillm serve), watched as requests arrive
  playback     the step player itself (controls, panels), shared by the views that replay traces

A new view is a module with a `show()` function and one line in app.py's VIEWS.
"""
