"""The synthetic tasks the tiny model learns (count down, spell a number) and the training run."""
