"""Section 3, weight quantization: ``quant`` (the quantizers), ``quant_error`` (their errors and the weights'
statistics), ``lowbit`` (real low-bit kernels), ``formats`` (what the libraries store), ``crosscheck`` (the
quantizers against the libraries' kernels).
"""
