module vpc-attach/e2e/bench/launcher

go 1.21
