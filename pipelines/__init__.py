"""The named task pipelines, declared explicitly (imported only when used)."""
from seqapps.pipeline import REGISTRY

REGISTRY.declare("weather_forecasting", "pipelines.forecasting:WeatherForecasting",
                 "next 24 h of air temperature from past hourly weather (LSTM/GRU encoder)")
REGISTRY.declare("load_forecasting", "pipelines.forecasting:LoadForecasting",
                 "next day of electricity demand from past demand and calendar features")
REGISTRY.declare("language_model", "pipelines.language_model:LanguageModel",
                 "word-level language model (FFNN/RNN/LSTM, ReLU bottleneck) trained with B-NCE, S-NCE or softmax")
REGISTRY.declare("text_generation", "pipelines.text_generation:TextGeneration",
                 "character-level LSTM text generator (char-RNN) with temperature and top-k sampling")
REGISTRY.declare("copy_task", "pipelines.copy_task:CopyTask",
                 "copy task for the decoupled HRNN: repeat a binary string after reading it (bits per character)")
REGISTRY.declare("pixel_mnist", "pipelines.pixel_mnist:PixelMnist",
                 "sequential (optionally permuted) pixel digit classification with the decoupled HRNN")
REGISTRY.declare("hrnn_char_lm", "pipelines.hrnn_char_lm:HRNNCharLM",
                 "character-level language model, HRNN upper level ticking at word ends (bits per character)")
REGISTRY.declare("speech_recognition", "pipelines.speech_recognition:SpeechRecognition",
                 "speech to text: deep bidirectional RNN (or decoupled HRNN) with CTC over characters, word timings")
