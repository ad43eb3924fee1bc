"""DDCL-INCRT (docs/ddcl_incrt.md): its configuration, modeling, the INCRT gate and head growth (`incrt`),
the prototype FFN and the BERT converter."""
