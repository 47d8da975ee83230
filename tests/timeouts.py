"""The subprocess timeout of the tests: a guard against a child that hangs, never a speed check. The machine may be
shared and loaded (at load 20 on 2 cores, importing torch alone lost to a 120 s timeout), so it is an hour."""

HANG_TIMEOUT_S = 3600
