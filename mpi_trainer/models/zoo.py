"""Built-in models. Each is ``builder(input_shape, num_classes, activation) -> keras.Model`` (uncompiled).

``activation`` is the output layer's (``model.activation``): ``softmax`` or
``sigmoid``. Image models need (height, width, channels) inputs and build for
any size and channel count, so they fit MNIST (28x28x1), CIFAR-10 (32x32x3)
and the 8x8 digits alike.
"""

from __future__ import annotations

import keras
from keras import layers

from mpi_trainer.errors import DataError


def _image_input(input_shape: tuple[int, ...], name: str) -> keras.KerasTensor:
    if len(input_shape) != 3:
        raise DataError(f"{name} needs image input (height, width, channels); "
                         f"received input shape {tuple(input_shape)}")
    return keras.Input(input_shape)


def lenet(input_shape: tuple[int, ...], num_classes: int, activation: str = "softmax") -> keras.Model:
    """The originating Keras "LeNet": 484,714 parameters on 28x28x1 inputs."""
    return keras.Sequential(
        [
            _image_input(input_shape, "lenet"),
            layers.Conv2D(32, 5, padding="same", activation="relu"),
            layers.Conv2D(32, 5, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Dropout(0.25),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Dropout(0.25),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation=activation),
        ],
        name="lenet",
    )


def mlp(input_shape: tuple[int, ...], num_classes: int, activation: str = "softmax") -> keras.Model:
    """A two-hidden-layer perceptron for small images and tabular data."""
    return keras.Sequential(
        [
            keras.Input(input_shape),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(64, activation="relu"),
            layers.Dense(num_classes, activation=activation),
        ],
        name="mlp",
    )


def softmax_regression(input_shape: tuple[int, ...], num_classes: int,
                       activation: str = "softmax") -> keras.Model:
    """One dense layer from the features to the classes (multinomial logistic regression)."""
    return keras.Sequential(
        [keras.Input(input_shape), layers.Flatten(), layers.Dense(num_classes, activation=activation)],
        name="softmax_regression",
    )


def _mlpconv(x: keras.KerasTensor, filters: int, kernel: int) -> keras.KerasTensor:
    """NIN's micro-network: a spatial convolution followed by two 1x1 convolutions."""
    x = layers.Conv2D(filters, kernel, padding="same", activation="relu")(x)
    x = layers.Conv2D(filters, 1, activation="relu")(x)
    return layers.Conv2D(filters, 1, activation="relu")(x)


def nin(input_shape: tuple[int, ...], num_classes: int, activation: str = "softmax") -> keras.Model:
    """Network in Network: three mlpconv stages, the last ending in one map per class, global pooling."""
    inputs = _image_input(input_shape, "nin")
    x = _mlpconv(inputs, 48, 5)
    x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    x = layers.Dropout(0.3)(x)
    x = _mlpconv(x, 96, 5)
    x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    x = layers.Dropout(0.3)(x)
    x = layers.Conv2D(96, 3, padding="same", activation="relu")(x)
    x = layers.Conv2D(96, 1, activation="relu")(x)
    x = layers.Conv2D(num_classes, 1)(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Activation(activation)(x), name="nin")


def _residual_block(x: keras.KerasTensor, filters: int, stride: int) -> keras.KerasTensor:
    shortcut = x
    y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
    y = layers.Activation("relu")(layers.BatchNormalization()(y))
    y = layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
    y = layers.BatchNormalization()(y)
    if stride != 1 or shortcut.shape[-1] != filters:
        shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
        shortcut = layers.BatchNormalization()(shortcut)
    return layers.Activation("relu")(layers.Add()([y, shortcut]))


def resnet20(input_shape: tuple[int, ...], num_classes: int, activation: str = "softmax") -> keras.Model:
    """CIFAR-style ResNet-20: three stages of three basic blocks (16, 32, 64 filters)."""
    inputs = _image_input(input_shape, "resnet20")
    x = layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    x = layers.Activation("relu")(layers.BatchNormalization()(x))
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(3):
            x = _residual_block(x, filters, 2 if stage > 0 and block == 0 else 1)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(num_classes, activation=activation)(x), name="resnet20")


def _bn_relu_conv(x: keras.KerasTensor, filters: int, kernel: int) -> keras.KerasTensor:
    x = layers.Activation("relu")(layers.BatchNormalization()(x))
    return layers.Conv2D(filters, kernel, padding="same", use_bias=False)(x)


def densenet(input_shape: tuple[int, ...], num_classes: int, activation: str = "softmax",
             growth: int = 12, layers_per_block: int = 4) -> keras.Model:
    """A small CIFAR-style DenseNet: three dense blocks, compressing transitions, global pooling."""
    inputs = _image_input(input_shape, "densenet")
    x = layers.Conv2D(2 * growth, 3, padding="same", use_bias=False)(inputs)
    for block in range(3):
        for _ in range(layers_per_block):
            x = layers.Concatenate()([x, _bn_relu_conv(x, growth, 3)])
        if block < 2:
            x = _bn_relu_conv(x, x.shape[-1] // 2, 1)
            x = layers.AveragePooling2D(2, padding="same")(x)
    x = layers.Activation("relu")(layers.BatchNormalization()(x))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(num_classes, activation=activation)(x), name="densenet")


ZOO = {
    "lenet": lenet,
    "mlp": mlp,
    "softmax_regression": softmax_regression,
    "nin": nin,
    "resnet20": resnet20,
    "densenet": densenet,
}
