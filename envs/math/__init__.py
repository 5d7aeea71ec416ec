"""Math-v0: verifiable arithmetic and algebra word problems (`problems`) and the env that grades answers (`env`)."""
