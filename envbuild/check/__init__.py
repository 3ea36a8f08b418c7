"""`envbuild check`: nightly verify + rebuild + reproducibility comparison, with reports and history."""
