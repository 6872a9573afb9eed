"""The GLM family: GLM-4.5/4.6/4.7 MoE, GLM-4.7-Lite, GLM-5 (DSA), GLM-5 Next."""
