"""vpc-attach: a CNI plugin that attaches Pods and VMs to tenant VPCs."""
