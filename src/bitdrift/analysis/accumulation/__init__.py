"""The order in which a kernel sums, revealed by testing it (after FPRev: Xie, Gao, Wang,
Xue, "Revealing Floating-Point Accumulation Orders in Software/Hardware Implementations",
USENIX ATC 2025).

A sum of n terms is a tree. Give term i the value +M, term j the value -M and every other
term 1, with M so large that adding any count of ones to ±M changes nothing (swamping).
Every partial sum that holds one of i, j is then exactly ±M, the node where i and j meet
gives 0, and only the ones added after that node survive: the output is n minus the
number of terms under the node where i and j meet. Those sizes for all pairs determine
the tree. A dot product is such a sum (its terms are the products, exact as long as the
factors are), and a Dense layer's output columns are independent dot products, so one
call with one probe pair per column reveals many pairs at once.

With float16 inputs (summed in float32, as most kernels do) M and the unit are 2**15 and
2**-24, the extremes float16 holds; the output then counts units.

A kernel that adds in a wider format (float64 accumulators) does not swamp; the outputs
are then not the integers this needs, and the revealing stops with an error saying so.

The modules: ``probes`` (a summing layer as a probe), ``trees`` (a sum's order as a tree),
``reveal`` (the search), ``names`` (an order in words), ``replay`` (numpy in that order),
``tables`` (the orders over records). The record's attribute is checked by
bitdrift.record.orders.
"""
