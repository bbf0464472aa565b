"""Core ML ``.mlmodel`` (``Model.proto``): the message paths that lead to ``WeightParams``, generated from
coremltools 9.0's descriptors (``coremltools.proto.Model_pb2``): message -> {field number: (field name, message)}.

Only the fields on a path to a weight are listed; the walker skips every other field by its length.
"""

from __future__ import annotations

WEIGHT_PATHS: dict[str, dict[int, tuple[str, str]]] = {
    "ActivationPReLU": {1: ("alpha", "WeightParams")},
    "ActivationParametricSoftplus": {1: ("alpha", "WeightParams"), 2: ("beta", "WeightParams")},
    "ActivationParams": {
        25: ("PReLU", "ActivationPReLU"), 71: ("parametricSoftplus", "ActivationParametricSoftplus"),
    },
    "BatchedMatMulLayerParams": {8: ("weights", "WeightParams"), 9: ("bias", "WeightParams")},
    "BatchnormLayerParams": {
        15: ("gamma", "WeightParams"), 16: ("beta", "WeightParams"), 17: ("mean", "WeightParams"),
        18: ("variance", "WeightParams"),
    },
    "BiDirectionalLSTMLayerParams": {
        10: ("activationsForwardLSTM", "ActivationParams"), 11: ("activationsBackwardLSTM", "ActivationParams"),
        20: ("weightParams", "LSTMWeightParams"),
    },
    "BiasLayerParams": {2: ("bias", "WeightParams")},
    "BranchLayerParams": {1: ("ifBranch", "NeuralNetwork"), 2: ("elseBranch", "NeuralNetwork")},
    "Convolution3DLayerParams": {60: ("weights", "WeightParams"), 61: ("bias", "WeightParams")},
    "ConvolutionLayerParams": {90: ("weights", "WeightParams"), 91: ("bias", "WeightParams")},
    "CustomLayerParams": {20: ("weights", "WeightParams")},
    "EmbeddingLayerParams": {20: ("weights", "WeightParams"), 21: ("bias", "WeightParams")},
    "EmbeddingNDLayerParams": {20: ("weights", "WeightParams"), 21: ("bias", "WeightParams")},
    "GRULayerParams": {
        10: ("activations", "ActivationParams"), 30: ("updateGateWeightMatrix", "WeightParams"),
        31: ("resetGateWeightMatrix", "WeightParams"), 32: ("outputGateWeightMatrix", "WeightParams"),
        50: ("updateGateRecursionMatrix", "WeightParams"), 51: ("resetGateRecursionMatrix", "WeightParams"),
        52: ("outputGateRecursionMatrix", "WeightParams"), 70: ("updateGateBiasVector", "WeightParams"),
        71: ("resetGateBiasVector", "WeightParams"), 72: ("outputGateBiasVector", "WeightParams"),
    },
    "InnerProductLayerParams": {20: ("weights", "WeightParams"), 21: ("bias", "WeightParams")},
    "LSTMWeightParams": {
        1: ("inputGateWeightMatrix", "WeightParams"), 2: ("forgetGateWeightMatrix", "WeightParams"),
        3: ("blockInputWeightMatrix", "WeightParams"), 4: ("outputGateWeightMatrix", "WeightParams"),
        20: ("inputGateRecursionMatrix", "WeightParams"), 21: ("forgetGateRecursionMatrix", "WeightParams"),
        22: ("blockInputRecursionMatrix", "WeightParams"), 23: ("outputGateRecursionMatrix", "WeightParams"),
        40: ("inputGateBiasVector", "WeightParams"), 41: ("forgetGateBiasVector", "WeightParams"),
        42: ("blockInputBiasVector", "WeightParams"), 43: ("outputGateBiasVector", "WeightParams"),
        60: ("inputGatePeepholeVector", "WeightParams"), 61: ("forgetGatePeepholeVector", "WeightParams"),
        62: ("outputGatePeepholeVector", "WeightParams"),
    },
    "LayerNormalizationLayerParams": {3: ("gamma", "WeightParams"), 4: ("beta", "WeightParams")},
    "LoadConstantLayerParams": {2: ("data", "WeightParams")},
    "LoadConstantNDLayerParams": {2: ("data", "WeightParams")},
    "LoopLayerParams": {3: ("conditionNetwork", "NeuralNetwork"), 4: ("bodyNetwork", "NeuralNetwork")},
    "Model": {
        200: ("pipelineClassifier", "PipelineClassifier"), 201: ("pipelineRegressor", "PipelineRegressor"),
        202: ("pipeline", "Pipeline"), 303: ("neuralNetworkRegressor", "NeuralNetworkRegressor"),
        403: ("neuralNetworkClassifier", "NeuralNetworkClassifier"), 500: ("neuralNetwork", "NeuralNetwork"),
    },
    "NeuralNetwork": {1: ("layers", "NeuralNetworkLayer")},
    "NeuralNetworkClassifier": {1: ("layers", "NeuralNetworkLayer")},
    "NeuralNetworkLayer": {
        100: ("convolution", "ConvolutionLayerParams"), 130: ("activation", "ActivationParams"),
        140: ("innerProduct", "InnerProductLayerParams"), 150: ("embedding", "EmbeddingLayerParams"),
        160: ("batchnorm", "BatchnormLayerParams"), 245: ("scale", "ScaleLayerParams"),
        250: ("bias", "BiasLayerParams"), 290: ("loadConstant", "LoadConstantLayerParams"),
        400: ("simpleRecurrent", "SimpleRecurrentLayerParams"), 410: ("gru", "GRULayerParams"),
        420: ("uniDirectionalLSTM", "UniDirectionalLSTMLayerParams"),
        430: ("biDirectionalLSTM", "BiDirectionalLSTMLayerParams"), 500: ("custom", "CustomLayerParams"),
        605: ("branch", "BranchLayerParams"), 615: ("loop", "LoopLayerParams"),
        1040: ("embeddingND", "EmbeddingNDLayerParams"), 1045: ("batchedMatmul", "BatchedMatMulLayerParams"),
        1070: ("loadConstantND", "LoadConstantNDLayerParams"),
        1350: ("layerNormalization", "LayerNormalizationLayerParams"),
        1471: ("convolution3d", "Convolution3DLayerParams"),
    },
    "NeuralNetworkRegressor": {1: ("layers", "NeuralNetworkLayer")},
    "Pipeline": {1: ("models", "Model")},
    "PipelineClassifier": {1: ("pipeline", "Pipeline")},
    "PipelineRegressor": {1: ("pipeline", "Pipeline")},
    "ScaleLayerParams": {2: ("scale", "WeightParams"), 5: ("bias", "WeightParams")},
    "SimpleRecurrentLayerParams": {
        10: ("activation", "ActivationParams"), 30: ("weightMatrix", "WeightParams"),
        31: ("recursionMatrix", "WeightParams"), 32: ("biasVector", "WeightParams"),
    },
    "UniDirectionalLSTMLayerParams": {
        10: ("activations", "ActivationParams"), 20: ("weightParams", "LSTMWeightParams"),
    },
}
