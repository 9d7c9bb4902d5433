"""The routing decision core: plain data in, a decision and its trace out. No Django here."""
